"""PyTorch's OpInfo checks against the inductor executor, through the core's conformance kit.

``min_region_size=1`` hands even single operations to Inductor, so every op it claims is checked.
"""

from thunder_core.testing.conformance import conformance_tests

test_forward, test_gradients = conformance_tests("inductor", options={"inductor": {"min_region_size": 1}})
