"""What a job that uses only the torch executor imports: not PyTorch's compiler stack."""

import json
import subprocess
import sys
import textwrap

_PROGRAM = textwrap.dedent(
    """
    import json, sys
    import torch
    import thunder_core

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(16)
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            return torch.softmax(self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x)))), -1)

    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(8, 16)
    add = thunder_core.jit(lambda a, b: a + b, executors=["torch"])
    same_add = torch.equal(add(x, x), x + x)
    # PyTorch's type promotion and broadcasting rules import sympy (0.35 s) on first use; a + b
    # of two tensors of one dtype and shape needs neither, and PyTorch's meta kernel is not run
    add_imported = [m for m in ("sympy", "packaging.requirements") if m in sys.modules]
    jmodel = thunder_core.jit(model, executors=["torch"])
    out = jmodel(x)
    out.sum().backward()  # capture, autodiff and the backward, all without Dynamo
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).sum().backward()
    same = same_add and torch.allclose(out, model(x)) and all(
        torch.allclose(g, p.grad, atol=1e-6) for g, p in zip(grads, model.parameters())
    )
    loaded = [m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules]
    print(json.dumps({"same": same, "loaded": loaded, "add_imported": add_imported}))
    """
)


def test_a_torch_executor_job_imports_neither_dynamo_nor_inductor():
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "loaded": [], "add_imported": []}


def test_dynamo_imported_after_a_capture_still_disables_itself_in_meta_kernels():
    """The stand-ins used while torch._dynamo is not loaded give way to Dynamo's own wrapper once
    it is: torch.compile in the same process compiles and matches eager."""
    code = _PROGRAM + textwrap.dedent(
        """
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        print(json.dumps(bool(torch.allclose(compiled(x), model(x)))))
        jagain = thunder_core.jit(lambda a: torch.nn.functional.silu(a) * 2, executors=["torch"])
        print(json.dumps(bool(torch.allclose(jagain(x), torch.nn.functional.silu(x) * 2))))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = done.stdout.strip().splitlines()
    assert lines[-2:] == ["true", "true"]


def test_metadata_of_same_layout_elementwise_operations_matches_pytorchs():
    """The answers given without PyTorch's meta kernels or promotion rules (for a first ``a + b``)
    are PyTorch's: for each dtype, with and without grad, against eager, and anything else (a
    broadcast, another layout, another dtype, a number) still goes to PyTorch's rules."""
    import torch
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
    from torch._prims_common import elementwise_dtypes

    import thunder_core
    from thunder_core.ops._helpers import promote

    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.uint8, torch.complex64]  # fmt: skip
    for dtype in dtypes:
        for kind in Kind:
            a, b = torch.zeros(2, 3, dtype=dtype), torch.zeros((), dtype=dtype)
            assert promote(a, b, kind=kind) == tuple(elementwise_dtypes(a, b, type_promotion_kind=kind))
    quantized = torch._empty_affine_quantized((2,), scale=0.1, zero_point=0, dtype=torch.quint8)
    for call in (lambda: promote(quantized, quantized, kind=Kind.DEFAULT), lambda: elementwise_dtypes(
        quantized, quantized, type_promotion_kind=Kind.DEFAULT)):  # fmt: skip
        try:
            call()
        except Exception as error:  # PyTorch's rule refuses it, and so do we, with its message
            assert "dtype" in str(error), error
        else:
            raise AssertionError("a quantized dtype was promoted")
    cases = [
        (torch.randn(3, 4), torch.randn(3, 4)),
        (torch.randn(3, 4, dtype=torch.float64, requires_grad=True), torch.randn(3, 4, dtype=torch.float64)),
        (torch.randn(4, 3).t(), torch.randn(4, 3).t()),  # transposed: PyTorch keeps the layout
        (torch.randn(3, 4), torch.randn(4)),  # broadcast
        (torch.randn(3, 4), torch.randn(3, 4, dtype=torch.float64)),  # promotion
        (torch.randint(0, 5, (2, 1, 3)), torch.randint(0, 5, (2, 1, 3))),
        (torch.randn(1, 5, dtype=torch.bfloat16), torch.randn(1, 5, dtype=torch.bfloat16)),
    ]
    for op in (torch.add, torch.sub, torch.mul, torch.maximum, lambda x, y: x * y, lambda x, y: x - y):
        jop = thunder_core.jit(op, executors=["torch"])
        for a, b in cases:
            got, want = jop(a, b), op(a, b)
            assert (got.shape, got.stride(), got.dtype, got.requires_grad) == (
                want.shape, want.stride(), want.dtype, want.requires_grad
            )  # fmt: skip
            torch.testing.assert_close(got, want)
