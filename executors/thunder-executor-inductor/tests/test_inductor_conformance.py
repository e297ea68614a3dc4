"""PyTorch's OpInfo checks against the inductor executor, through the core's conformance kit.

Every claimed region is a real Inductor compile, so CI checks the OpInfos of the ops transformer
models use; ``THUNDER_CONFORMANCE=full pytest ...`` runs the whole database.
``min_region_size=0`` hands every claimed operation to Inductor, views included.
"""

from thunder_core.testing.conformance import TRANSFORMER_OPS, conformance_tests

test_forward, test_gradients = conformance_tests(
    "inductor", options={"inductor": {"min_region_size": 0}}, ops=TRANSFORMER_OPS
)
