"""PyTorch's OpInfo checks against the nvfuser executor, with samples built on CUDA (skipped without a GPU)."""

from thunder_core.testing.conformance import TRANSFORMER_OPS, conformance_tests

test_forward, test_gradients = conformance_tests(
    "nvfuser", options={"nvfuser": {"min_region_size": 1}}, ops=TRANSFORMER_OPS, device="cuda"
)
