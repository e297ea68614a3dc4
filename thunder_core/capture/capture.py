"""Capturing a function: proxies for its inputs, the capture mode around the call."""

from __future__ import annotations

import keyword
import re
import sys
import threading
import time
from contextlib import contextmanager, nullcontext

import torch
from torch.utils import _pytree as pytree

from thunder_core.capture.autograd_function import autograd_functions_recorded_whole
from thunder_core.capture.blocks import blocks_recorded
from thunder_core.capture.mode import CaptureMode
from thunder_core.capture.module_hooks import module_backward_hooks_recorded
from thunder_core.capture.objects import ArgumentObjects, is_argument_object, object_items
from thunder_core.capture.reads import ExecutedUserCode, global_chains
from thunder_core.capture.recorder import Namer, Recorder, record_scope
from thunder_core.capture.symbolic import SymbolicSizes, capturing_symbolically
from thunder_core.capture.torch_fast_paths import encoder_fast_path_as_eager
from thunder_core.capture.torch_vmap import vmap_recorded
from thunder_core.errors import CaptureError
from thunder_core.ir.proxies import NumberProxy, TensorProxy
from thunder_core.ir.trace import Provenance, Trace
from thunder_core.ops.autocast_policy import DEVICE_TYPES as AUTOCAST_DEVICE_TYPES

RESERVED_NAMES = frozenset({"torch", "prims"})
_PLAIN_LEAVES = (
    TensorProxy,
    torch.Tensor,
    int,
    float,
    bool,
    complex,
    str,
    type(None),
    torch.dtype,
    torch.device,
    torch.SymInt,  # a size or int of a symbolic capture: the program computes it on every call
    torch.SymFloat,
    torch.SymBool,
)


def _identifier(path: str) -> str:
    """A Python identifier made of ``path``'s ASCII letters, digits and underscores.

    Never starts with a digit or an underscore (names starting with ``_`` are the
    generated globals'), never a keyword or a reserved module name.
    """
    name = re.sub(r"[^0-9a-zA-Z_]", "_", path.encode("ascii", "replace").decode()).strip("_")
    name = re.sub(r"__+", "_", name) or "arg"
    if name[0].isdigit():
        name = "p" + name
    if keyword.iskeyword(name) or keyword.issoftkeyword(name) or name in RESERVED_NAMES:
        name += "_"
    return name


class _InputBuilder:
    """Replaces tensors in the user's arguments by named proxies, in the runtime leaf order."""

    def __init__(self, sizes: SymbolicSizes | None = None):
        self.inputs: list = []
        self.taken: set[str] = set(RESERVED_NAMES)
        self._sizes = sizes
        self.objects = ArgumentObjects()

    def _name(self, path: str) -> str:
        base = _identifier(path)
        name, n = base, 0
        while name in self.taken or re.fullmatch(r"[ts]\d+", name):
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def proxify(self, x, path: str, route: tuple = ()):
        """``x`` with its tensors replaced by input proxies: plain lists, dicts and objects in
        place (``self.objects`` tracks them, ``route`` says where they are among the arguments),
        tuples and other containers rebuilt."""
        if isinstance(x, torch.Tensor):
            name = self._name(path)
            shape, strides = x.shape, x.stride()
            if self._sizes is not None:
                shape, strides = self._sizes.metadata(x, len(self.inputs), name)
            proxy = TensorProxy(name, shape, x.dtype, x.device, x.requires_grad, strides)
            self.inputs.append(proxy)
            self.objects.input_routes[id(proxy)] = route
            return proxy
        if isinstance(x, (bool, int, float, complex)):
            name = self._name(path)
            if self._sizes is not None:  # an int it makes symbolic: the program sees a SymInt
                x = self._sizes.number(x, len(self.inputs), name)
            self.inputs.append(NumberProxy(name, x))
            return x
        if type(x) is list or type(x) is dict or is_argument_object(x):
            kind = "list" if type(x) is list else "dict" if type(x) is dict else "object"
            tracked = self.objects.track(x, kind, route)
            if tracked is None:
                return x  # reached before through another route: proxified already
            items = enumerate(x) if kind == "list" else x.items() if kind == "dict" else object_items(x)
            state = vars(x) if kind == "object" else x
            separator = "." if kind == "object" else "_"
            for k, item in list(items):
                step = ("attr", k) if kind == "object" else ("item", k)
                new = self.proxify(item, f"{path}{separator}{k}", (*route, step))
                if new is not item:
                    state[k] = new
            self.objects.proxified(tracked)
            return x
        if isinstance(x, (list, tuple)):
            items = [self.proxify(item, f"{path}_{i}", (*route, ("item", i))) for i, item in enumerate(x)]
            if type(x) is tuple:
                return tuple(items)
            rebuilt = type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
            if isinstance(x, list):
                self.objects.rebuilt.append((path, rebuilt, list(rebuilt)))
            return rebuilt
        if isinstance(x, dict):
            rebuilt = type(x)(
                (k, self.proxify(v, f"{path}_{k}", (*route, ("item", k)))) for k, v in x.items()
            )
            self.objects.rebuilt.append((path, rebuilt, [*rebuilt.keys(), *rebuilt.values()]))
            return rebuilt
        return x


class TensorLifter:
    """Turns real tensors met during capture (module attributes, globals, closures) into inputs.

    Their data is read on every call (an in-place change is seen); where they came from is
    guarded by identity, so a new tensor in their place recompiles.
    """

    def __init__(self, builder: _InputBuilder, paths: dict[int, str]):
        self._builder = builder
        self._paths = paths
        self.lifted: dict[int, tuple[torch.Tensor, TensorProxy]] = {}
        self.arrays_read: set[int] = set()

    def __call__(self, x):
        if type(x) is TensorProxy or not isinstance(x, torch.Tensor) or x.device.type == "meta":
            if type(x).__name__ == "ndarray":
                self.arrays_read.add(id(x))  # NumPy data flowing into a torch call (from_numpy, tensor)
            return x
        found = self.lifted.get(id(x))
        if found is None:
            name = self._builder._name(self._paths.get(id(x), "constant"))
            proxy = TensorProxy(name, x.shape, x.dtype, x.device, x.requires_grad, x.stride())
            self._builder.inputs.append(proxy)
            found = self.lifted[id(x)] = (x, proxy)
        return found[1]

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [tensor for tensor, _ in self.lifted.values()]


_compiling_lock = threading.Lock()
_compiling_count = 0
_compiling_saved = False


@contextmanager
def _compile_session():
    """``torch.compiler._is_compiling_flag`` True until the last session of the process ends,
    then what it was before the first began: counted, so that sessions on several threads that
    overlap leave it as they found it."""
    global _compiling_count, _compiling_saved
    with _compiling_lock:
        if _compiling_count == 0:
            _compiling_saved = torch.compiler._is_compiling_flag
        _compiling_count += 1
        torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        with _compiling_lock:
            _compiling_count -= 1
            if _compiling_count == 0:
                torch.compiler._is_compiling_flag = _compiling_saved


def _count_dynamo_sessions() -> None:
    """Dynamo's compile sessions counted with captures. Dynamo saves the flag when a session
    begins and puts it back when it ends: a capture on another thread that began in between and
    ended first would leave the flag True for good (eager code would then take its compiled
    paths)."""
    if getattr(torch.compiler, "_is_compiling_flag", None) is None:
        return  # a torch without the flag (and its sessions)
    if getattr(torch.compiler, "_compile_session_context", None) not in (None, _compile_session):
        torch.compiler._compile_session_context = _compile_session


_count_dynamo_sessions()  # at import: a session that began before a first capture is counted too


@contextmanager
def _compiling():
    """``torch.compiler.is_compiling()`` is True while capturing, as under torch.compile.

    Libraries (transformers among them) test it to skip data-dependent checks and take
    their trace-friendly code paths. The flag is process-wide: it is set while any thread
    captures (or Dynamo compiles) and restored when the last of them ends.
    """
    if getattr(torch.compiler, "_is_compiling_flag", None) is None:
        yield
        return
    with _compile_session():
        yield


def _is_plain(out) -> bool:
    if type(out) in (tuple, list):
        return all(_is_plain(x) for x in out)
    if type(out) is dict:
        return all(isinstance(k, (str, int)) and _is_plain(v) for k, v in out.items())
    return isinstance(out, _PLAIN_LEAVES)


def _check_leaves(flat: list) -> None:
    for leaf in flat:
        if not isinstance(leaf, _PLAIN_LEAVES):
            raise TypeError(
                f"thunder_core.jit: the function returned an object of type {type(leaf).__qualname__} "
                "that thunder_core cannot look inside. Return tensors and Python values in "
                "tuples, lists, dicts or dataclasses registered with torch.utils._pytree, or the "
                "argument objects it was given."
            )


def _compiled_code_as_written():
    """A ``torch.compile``d module or function that the captured code calls runs its Python as
    written, which capture records (Dynamo would trace the proxies and capture's own mode):
    ``torch.compiler.set_stance("force_eager")`` for the capture. The stance is process-wide: a
    compiled function another thread calls meanwhile runs eagerly too, with the same results.
    When Dynamo was never imported nothing can be compiled by it, and it is not imported here;
    where Dynamo's frame evaluation is on, or the user chose another stance, it is left alone."""
    if "torch._dynamo" not in sys.modules:
        return nullcontext()
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
        from torch._dynamo.eval_frame import _stance

        if get_eval_frame_callback() not in (None, False) or _stance.stance != "default":
            return nullcontext()
        return torch.compiler.set_stance("force_eager")
    except (ImportError, AttributeError, RuntimeError):  # private names of torch that may move
        return nullcontext()


def _switches() -> tuple:
    """Grad mode and autocast: state the captured code may switch for a block of its own."""
    return torch.is_grad_enabled(), *(
        (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AUTOCAST_DEVICE_TYPES
    )


def _restore_switches(state: tuple) -> None:
    torch.set_grad_enabled(state[0])
    for device, (enabled, dtype) in zip(AUTOCAST_DEVICE_TYPES, state[1:]):
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)


def _describe_switches(state: tuple) -> list[str]:
    grad = f"grad mode {'enabled' if state[0] else 'disabled'}"
    autocast = [
        f"{device} autocast {'to ' + str(dtype).removeprefix('torch.') if enabled else 'off'}"
        for device, (enabled, dtype) in zip(AUTOCAST_DEVICE_TYPES, state[1:])
    ]
    return [grad, *autocast]


def _left_switched(before: tuple) -> CaptureError:
    changed = [
        f"{now} (it was {then} when called)"
        for then, now in zip(_describe_switches(before), _describe_switches(_switches()))
        if then != now
    ]
    return CaptureError(
        f"thunder_core.jit: the function returns with {', '.join(changed)}: a program does not switch its "
        "caller's state, so later calls would leave it as it was. Way out: switch it for a block inside the "
        "function (`with torch.no_grad():`, `with torch.autocast(...):`), or outside the jitted function."
    )


def capture(
    fn,
    args: tuple,
    kwargs: dict,
    *,
    positional_names: list[str],
    extra_inputs: list[tuple[str, torch.Tensor]] = (),
    extra_binder=None,
    guard_builder=None,
    block_modules=(),
    capture_blocks_once: bool = False,
    symbolic_sizes: SymbolicSizes | None = None,
) -> tuple[Trace, list[torch.Tensor]]:
    """Run ``fn(*args, **kwargs)`` on proxies and return the trace of what it did.

    ``extra_inputs`` (name, tensor) pairs become trace inputs after the arguments;
    ``extra_binder(proxies)`` is a context manager that makes ``fn`` see those proxies
    (``jit(module)`` swaps parameters and buffers in this way).

    Returns the trace and the real tensors the function used that were not among its inputs
    (module attributes, globals, closures): they are the trace's last inputs. With a
    ``guard_builder``, the globals read by the user code that runs are guarded as they were
    before that code ran. Each call of one of ``block_modules`` is recorded as one ``block``
    bound symbol holding its operations (``thunder_core.capture.blocks``); with
    ``capture_blocks_once``, one that would do what an earlier one did is copied from it
    without running its Python (``thunder_core.capture.block_reuse``). With
    ``symbolic_sizes``, the dimensions it names of the inputs have symbolic sizes.
    """
    start = time.perf_counter()
    builder = _InputBuilder(symbolic_sizes)
    switches = _switches()
    try:
        proxy_args = tuple(
            builder.proxify(
                a, positional_names[i] if i < len(positional_names) else f"args_{i}", (("arg", i),)
            )
            for i, a in enumerate(args)
        )
        proxy_kwargs = {k: builder.proxify(v, k, (("kwarg", k),)) for k, v in kwargs.items()}
        extra_proxies = [builder.proxify(t, name) for name, t in extra_inputs]

        paths = guard_builder.tensor_paths if guard_builder is not None else {}
        lifter = TensorLifter(builder, paths)
        recorder = Recorder(Namer(builder.taken), top_level=True)
        binder = extra_binder(extra_proxies) if extra_binder is not None else nullcontext()
        # Seeding and Python-level random draws are refused with or without guards.
        reads = ExecutedUserCode(
            (lambda code, g: guard_builder.globals_of(code, g, global_chains(code)))
            if guard_builder is not None
            else (lambda code, g: None)
        )
        with (
            _compiling(),
            capturing_symbolically(symbolic_sizes),
            record_scope(recorder),
            autograd_functions_recorded_whole(),
            module_backward_hooks_recorded(),
            CaptureMode(lifter),
            binder,  # inside capture: what a plugin records while binding is part of the trace
            reads,
            blocks_recorded(list(block_modules), reuse=capture_blocks_once),
            _compiled_code_as_written(),
            encoder_fast_path_as_eager(guard_builder),
            vmap_recorded(),
        ):
            out = fn(*proxy_args, **proxy_kwargs)
        if _switches() != switches:
            raise _left_switched(switches)
        out, epilogue, changed = builder.objects.epilogue(out, _is_plain)
    finally:
        builder.objects.restore()  # the caller's objects as they were; the epilogue redoes the changes
        _restore_switches(switches)  # also where the function raised inside a block
    recorder.namer.taken.update(builder.taken)
    if guard_builder is not None:
        guard_builder.arrays_read |= lifter.arrays_read
        guard_builder.check_arrays_read()
    reset = reads.generator_reset
    if reset is not None:
        raise CaptureError(
            f"thunder_core.jit: {reset} while being captured. The trace records random draws, not the seeding, "
            "so later calls would continue the stream where eager starts it again. Way out: seed outside the "
            "jitted function, before calling it."
        )
    if guard_builder is not None and reads.random_draw is None:
        reads.random_draw = guard_builder.random_draw()
    if reads.random_draw is not None:
        raise CaptureError(
            f"thunder_core.jit: {reads.random_draw} while being captured; the number drawn would be frozen "
            "into the trace and repeat on every call. Ways out: draw with torch (torch.rand, torch.randint, "
            "torch.bernoulli run on every call), or draw outside the jitted function and pass the value in "
            "(the trace is specialized on it)."
        )

    treespec = None
    if epilogue is not None:
        _check_leaves(out if epilogue.treespec is not None else [])
        out = [*out, *changed]  # the function's outputs, flat, then what the epilogue stores
    elif not _is_plain(out):
        flat, treespec = pytree.tree_flatten(out)
        _check_leaves(flat)
        out = flat
    if symbolic_sizes is not None:
        symbolic_sizes.name_sizes(builder.inputs)
    trace = Trace(
        inputs=builder.inputs,
        bound_symbols=recorder.bound_symbols,
        output=out,
        provenance=Provenance("capture", time.perf_counter() - start),
        output_treespec=treespec,
        epilogue=epilogue,
    )
    return trace, lifter.tensors
