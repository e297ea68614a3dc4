"""A clean exit for gloo jobs: free a destroyed default process group before the interpreter ends.

``torch.distributed.nn.functional`` binds ``group.WORLD`` as a default argument when it is
imported. Imported after ``init_process_group`` (``torch._dynamo`` and Lightning import it, so
any later ``torch.compile`` or Inductor region does), its functions keep the default process
group alive after ``destroy_process_group()``: gloo's worker threads then run into interpreter
finalization, and a thread releasing a finished collective's tensors there cannot take the GIL
and aborts the process ("terminate called without an active exception", exit code -6) — at
random, more often on a loaded machine.

``release_at_exit()`` registers, once per process, an ``atexit`` hook that drops those stale
defaults (restoring what importing before ``init_process_group`` gives: ``None``, the default
group) so the destroyed group is freed and its threads joined while the interpreter is whole.
"""

from __future__ import annotations

import atexit
import sys
import threading

import torch.distributed as dist

_lock = threading.Lock()
_registered = False


def release_at_exit() -> None:
    """Register ``drop_group_defaults`` to run at interpreter exit (once per process)."""
    global _registered
    with _lock:
        if not _registered:
            atexit.register(drop_group_defaults)
            _registered = True


def drop_group_defaults() -> None:
    """Replace default arguments of ``torch.distributed.nn.functional`` that hold a process group by None.

    None means the default group when the function is called, which is what those defaults
    are; a group still initialized stays alive through torch.distributed itself, and one
    destroyed later (by another exit hook) is then freed.
    """
    functional = sys.modules.get("torch.distributed.nn.functional")
    if functional is None:
        return

    def stale(value) -> bool:
        return isinstance(value, dist.ProcessGroup)

    for function in list(vars(functional).values()):
        defaults = getattr(function, "__defaults__", None)
        if defaults and any(stale(value) for value in defaults):
            function.__defaults__ = tuple(None if stale(value) else value for value in defaults)
