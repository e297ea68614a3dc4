"""Training scenarios run by each rank under torchrun (started by the tests in this folder).

    python -m torch.distributed.run --nproc-per-node 2 worker.py OUT_DIR SCENARIO [SCENARIO ...]

Each scenario trains a small litgpt ``GPT`` for ``STEPS`` AdamW steps on this rank's half of a
global batch and writes ``OUT_DIR/SCENARIO.pt`` (from rank 0): the losses averaged over the ranks,
the full final parameters, and what the scenario measured (collectives in the traces, memory).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import thunder_core
from thunder_core.testing.models import small_litgpt

STEPS = 5
GLOBAL_BATCH = 4
LENGTH = 16
VOCAB = 127  # odd: the lm_head and embedding rows do not divide by 2 ranks (padding)
LR = 1e-3  # AdamW divides by sqrt(v): with larger steps, rounding in tiny gradients shows in the weights


def build_model():
    torch.manual_seed(0)
    return small_litgpt(n_layer=2, n_embd=64, vocab=VOCAB, block_size=32, n_query_groups=2)


def batches():
    generator = torch.Generator().manual_seed(1)
    return [
        torch.randint(0, VOCAB, (GLOBAL_BATCH, LENGTH + 1), generator=generator) for _ in range(STEPS + 1)
    ]


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class TiedModel(nn.Module):
    """What real models have besides plain weights: a weight shared by two layers, a frozen layer,
    a 0-dim parameter, a buffer, and sizes that do not divide by the number of ranks."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(11, 6)
        self.frozen = nn.Linear(6, 6)
        self.frozen.requires_grad_(False)
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embedding.weight
        self.register_buffer("offset", torch.arange(6.0) / 10)

    def forward(self, idx):
        h = self.embedding(idx) + self.offset
        return self.head(torch.tanh(self.frozen(h)) * self.scale)


def build_tied_model():
    torch.manual_seed(0)
    return TiedModel()


def tied_batches():
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(0, 11, (GLOBAL_BATCH, 9), generator=generator) for _ in range(STEPS)]


def reference_tied() -> dict:
    model = build_tied_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for tokens in tied_batches():
        loss = loss_of(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        logits = model.eval()(tied_batches()[0][:, :-1])
    return {
        "losses": losses,
        "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "logits": logits,
    }


CLIP = 0.5  # below the gradients' norm here, so clipping changes every step


def reference(steps: int = STEPS, clip: float | None = None) -> dict:
    """The single-process run over the global batch, in eager PyTorch."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for tokens in batches()[:steps]:
        loss = loss_of(model, tokens)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def _local(tokens: torch.Tensor) -> torch.Tensor:
    share = tokens.shape[0] // dist.get_world_size()
    return tokens[dist.get_rank() * share : (dist.get_rank() + 1) * share]


def _mean_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _train(
    model, optimizer, *, accumulate: int = 1, steps: int = STEPS, first_batch: int = 0, clip=None
) -> list[float]:
    losses = []
    for tokens in batches()[first_batch : first_batch + steps]:
        local = _local(tokens)
        micro = local.chunk(accumulate)
        total = 0.0
        for i, part in enumerate(micro):
            context = model.no_sync() if i < accumulate - 1 else nullcontext()
            with context:
                loss = loss_of(model, part) / accumulate
                loss.backward()
            total += loss.item()
        if clip is not None:
            clip(model)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(_mean_over_ranks(total))
    return losses


def _collectives(jitted) -> dict:
    from thunder_plugin_distributed.schedule import collectives_in

    backward_traces = thunder_core.last_backward_traces(jitted)
    forward = [t for t in thunder_core.last_traces(jitted) if t not in backward_traces][-1]
    backward = backward_traces[-1]
    return {
        "forward": collectives_in(forward),
        "backward": collectives_in(backward),
        "backward_ops": [b.symbol.name for b in backward.bound_symbols],
        "backward_code": str(backward),
        "forward_code": str(forward),
    }


def _parameter_elements(module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def _optimizer_elements(optimizer) -> int:
    return sum(
        v.numel()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim()
    )


def scenario_ddp(bucket_size_mb: int = 1, accumulate: int = 1) -> dict:
    model = build_model()
    jitted = thunder_core.jit(model, plugins=["ddp"], options={"ddp": {"bucket_size_mb": bucket_size_mb}})
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    losses = _train(jitted, optimizer, accumulate=accumulate)
    return {"losses": losses, "params": jitted.state_dict(), "collectives": _collectives(jitted)}


def scenario_ddp_one_per_gradient() -> dict:
    return scenario_ddp(bucket_size_mb=0)


def scenario_ddp_no_sync() -> dict:
    return scenario_ddp(accumulate=2)


def scenario_fsdp(zero: int = 3, optimizer_first: bool = False) -> dict:
    from thunder_plugin_distributed import full_state_dict

    model = build_model()
    full_elements = _parameter_elements(model)
    if optimizer_first:  # made on the full parameters, before jit shards them in place
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    jitted = thunder_core.jit(model, plugins=["fsdp"], options={"fsdp": {"zero": zero}})
    if not optimizer_first:
        optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    losses = _train(jitted, optimizer)
    return {
        "losses": losses,
        "params": full_state_dict(jitted),
        "collectives": _collectives(jitted),
        "parameter_elements": (_parameter_elements(jitted), full_elements),
        "optimizer_elements": _optimizer_elements(optimizer),
    }


def scenario_fsdp_clipped() -> dict:
    """Gradient clipping by the norm of the whole gradient, of which each rank holds shards."""
    from thunder_plugin_distributed import clip_grad_norm_, full_state_dict

    jitted = thunder_core.jit(build_model(), plugins=["fsdp"])
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    norms = []
    losses = _train(jitted, optimizer, clip=lambda m: norms.append(float(clip_grad_norm_(m, CLIP))))
    return {"losses": losses, "params": full_state_dict(jitted), "norms": norms}


def scenario_fsdp_zero2() -> dict:
    return scenario_fsdp(zero=2, optimizer_first=True)


def _with_default_executors(scenario) -> dict:
    """``scenario`` with the executors a user gets by default (fusion regions between the collectives)."""
    os.environ.pop("THUNDER_CORE_NO_AUTOLOAD", None)
    try:
        return scenario()
    finally:
        os.environ["THUNDER_CORE_NO_AUTOLOAD"] = "1"


def scenario_ddp_default_executors() -> dict:
    return _with_default_executors(scenario_ddp)


def _tied(plugin: str) -> dict:
    from thunder_plugin_distributed import full_state_dict

    model = build_tied_model()
    jitted = thunder_core.jit(model, plugins=[plugin])
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    losses = []
    for tokens in tied_batches():
        loss = loss_of(jitted, _local(tokens))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(_mean_over_ranks(loss.item()))
    with torch.no_grad():  # inference after training, in eval mode: another cache entry
        logits = jitted.eval()(_local(tied_batches()[0])[:, :-1])
    everything = [torch.zeros_like(logits) for _ in range(dist.get_world_size())]
    dist.all_gather(everything, logits)
    return {"losses": losses, "params": full_state_dict(jitted), "logits": torch.cat(everything)}


def scenario_ddp_tied() -> dict:
    return _tied("ddp")


def scenario_fsdp_tied() -> dict:
    return _tied("fsdp")


def scenario_ddp_from_environment() -> dict:
    """The plugin chosen by THUNDER_CORE_PLUGINS: the script does not name it."""
    os.environ["THUNDER_CORE_PLUGINS"] = "ddp"
    try:
        model = build_model()
        jitted = thunder_core.jit(model)
    finally:
        del os.environ["THUNDER_CORE_PLUGINS"]
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    losses = _train(jitted, optimizer)
    return {
        "losses": losses,
        "params": jitted.state_dict(),
        "extensions": [e.name for e in jitted.extensions],
    }


def scenario_fsdp_default_executors() -> dict:
    return _with_default_executors(scenario_fsdp)


def _with_activation_checkpointing(plugin: str) -> dict:
    from thunder_plugin_distributed import full_state_dict

    jitted = thunder_core.jit(
        build_model(), plugins=[plugin, "checkpoint"], options={"checkpoint": {"policy": "blocks"}}
    )
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    return {"losses": _train(jitted, optimizer), "params": full_state_dict(jitted)}


def scenario_ddp_with_activation_checkpointing() -> dict:
    return _with_activation_checkpointing("ddp")


def scenario_fsdp_with_activation_checkpointing() -> dict:
    return _with_activation_checkpointing("fsdp")


def scenario_ddp_wrapper() -> dict:
    """PyTorch's DistributedDataParallel around a jitted model."""
    from torch.nn.parallel import DistributedDataParallel

    model = build_model()
    wrapped = DistributedDataParallel(thunder_core.jit(model))
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    losses = _train(wrapped, optimizer)
    return {"losses": losses, "params": model.state_dict()}


def scenario_fully_shard_of_jitted_blocks() -> dict:
    """FSDP2: each block jitted, then sharded with fully_shard; the model root sharded too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = build_model()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    blocks = model.transformer.h
    for i in range(len(blocks)):
        blocks[i] = thunder_core.jit(blocks[i])
        fully_shard(blocks[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = _train(model, optimizer)
    params = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}
    return {"losses": losses, "params": params, "cache_info": [thunder_core.cache_info(b) for b in blocks]}


def scenario_jit_of_fully_shard() -> dict:
    """thunder_core.jit of a model whose blocks and root fully_shard (FSDP2) sharded, with the
    optimizer made on its DTensor parameters first: traced by the dtensor plugin."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = build_model()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    jitted = thunder_core.jit(model)
    losses = _train(jitted, optimizer)
    forward = [t for t in thunder_core.last_traces(jitted) if t.decisions][0]
    backward = [t for t in thunder_core.last_backward_traces(jitted) if t.decisions][-1]
    held = sum(p.to_local().numel() for p in model.parameters())
    loss_of(jitted, _local(batches()[0])).backward()  # the gradients the optimizer would step
    grads = [type(p.grad).__name__ for p in model.parameters()]
    optimizer.zero_grad()
    return {
        "losses": losses,
        "params": {
            k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()
        },
        "extensions": [e.name for e in jitted.extensions],
        "collectives": {
            "forward": [b.symbol.name for b in forward.bound_symbols],
            "backward": [b.symbol.name for b in backward.bound_symbols],
        },
        "parameter_elements": (held, sum(p.numel() for p in model.parameters())),
        "grad_types": set(grads),
    }


def scenario_fsdp_checkpoint() -> dict:
    """Train 3 steps, save with torch.distributed.checkpoint, load into a fresh model and
    optimizer, train the rest: the same as training straight through."""
    import torch.distributed.checkpoint as dcp
    from thunder_plugin_distributed import full_state_dict, load_optimizer_state_dict, optimizer_state_dict

    path = os.path.join(os.environ["THUNDER_TEST_OUT"], "checkpoint")
    model = build_model()
    jitted = thunder_core.jit(model, plugins=["fsdp"])
    optimizer = torch.optim.AdamW(jitted.parameters(), lr=LR)
    losses = _train(jitted, optimizer, steps=3)
    dcp.save(
        {"model": jitted.state_dict(), "optimizer": optimizer_state_dict(jitted, optimizer)},
        checkpoint_id=path,
    )

    torch.manual_seed(123)  # a fresh job: other initial weights, nothing shared with the first model
    fresh = thunder_core.jit(
        small_litgpt(n_layer=2, n_embd=64, vocab=VOCAB, block_size=32, n_query_groups=2), plugins=["fsdp"]
    )
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=LR)
    state = {"model": fresh.state_dict(), "optimizer": optimizer_state_dict(fresh, fresh_optimizer)}
    dcp.load(state, checkpoint_id=path)
    fresh.load_state_dict(state["model"])
    load_optimizer_state_dict(fresh, fresh_optimizer, state["optimizer"])
    losses += _train(fresh, fresh_optimizer, steps=STEPS - 3, first_batch=3)
    return {"losses": losses, "params": full_state_dict(fresh)}


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:]
    os.environ["THUNDER_TEST_OUT"] = out
    dist.init_process_group("gloo")
    try:
        for name in names:
            print(f"rank {dist.get_rank()}: {name}", flush=True)
            result = globals()[f"scenario_{name}"]()
            if dist.get_rank() == 0:
                torch.save(result, os.path.join(out, f"{name}.pt"))
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    # A crash in native code (an abort in a collective or a kernel) prints every thread's Python
    # stack, so the test's failure message says where it happened.
    faulthandler.enable(all_threads=True)
    tempfile.tempdir = None
    main()
    # Every result is written and the process group is gone: leave without running the
    # interpreter's teardown, where native threads of libraries still loaded can abort the process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
