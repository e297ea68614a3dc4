"""The OpInfos that thunder_core does not yet run like eager (float32, CPU), with why.

One shrinking list: tests/test_opinfo.py fails if an op here starts passing (remove it
from the list) or if an op not here fails. The conformance kit skips these for executors.
"""

KNOWN_FORWARD_FAILURES = {
    # Python values computed from tensor data: refused with DataDependentError, by design.
    "allclose": "returns a Python bool computed from tensor values",
    "equal": "returns a Python bool computed from tensor values",
    "nn.functional.gaussian_nll_loss": "validates `var` with a Python check on tensor values",
    "narrow": "a sample passes `start` as a tensor, whose value sets the output shape",
    # Output shapes that depend on tensor values: refused with DataDependentError, by design.
    "masked_select": "output shape depends on the mask's values",
    "unique": "output shape depends on the values",
    "unique_consecutive": "output shape depends on the values",
    "nonzero": "output shape depends on the values",
    "argwhere": "output shape depends on the values",
    "tensor_split": "a sample passes split indices as a tensor, whose values set the output shapes",
    # Layouts proxies do not model.
    "sparse.sampled_addmm": "sparse CSR inputs have no strides; proxies model strided tensors only",
    "sparse.mm.reduce": "sparse CSR inputs have no strides; proxies model strided tensors only",
    # In-place changes of a tensor's sizes: refused with CaptureError (a proxy's sizes are fixed).
    "resize_": "changes its input's sizes in place",
}

KNOWN_GRADIENT_FAILURES = {
    "linalg.eig": (
        "the sample's loss depends on the phase of complex eigenvectors; PyTorch's own backward refuses it "
        "when run through the autograd fallback on the detached outputs"
    ),
}
