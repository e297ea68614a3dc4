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
    print(json.dumps({"same": same, "loaded": loaded}))
    """
)


def test_a_torch_executor_job_imports_neither_dynamo_nor_inductor():
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "loaded": []}


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
