"""``ThunderFunction``: a jitted callable with its cache of compiled traces."""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import inspect
import threading
import types
import warnings
from typing import NamedTuple

import torch

from thunder_core.disk_cache import DEFAULT_CACHE_DIR, DiskCache, job_cache_directory, open_disk_cache
from thunder_core.errors import CaptureError
from thunder_core.executors.background import compiling_in_background, foreground_compile, wants_background
from thunder_core.executors.second_call import ProgramCalls, compiling_at_second_call
from thunder_core.ir.symbols import _recorders
from thunder_core.jit.cache_key import add_to_key, argument_containers, describe
from thunder_core.jit.dynamic import (
    by_position,
    check_dynamic,
    describe_dims,
    fits,
    tensor_positions,
    to_make_symbolic,
)
from thunder_core.jit.fingerprint import versions
from thunder_core.jit.guards import CompositeGuard, GuardBuilder, TooMuchState
from thunder_core.jit.last_entry import LastEntryPaths, StructuredEntry, tensor_metadata_check
from thunder_core.jit.persistent import key_material, restore, save
from thunder_core.jit.pipeline import Compiled, compile_function
from thunder_core.jit.rebind import rebind
from thunder_core.jit.side_effects import check_side_effects
from thunder_core.ops.kept_answers import metadata_kept_in
from thunder_core.progress import compiling

#: The innermost torch.func transform in effect, or None (one C call: the hot path checks it).
_torch_func_level = torch._C._functorch.peek_interpreter_stack
#: Dynamo's frame callback, set while a torch.compile'd function runs (one C call; absent in old torch).
_dynamo_callback = getattr(torch._C._dynamo.eval_frame, "get_eval_frame_callback", lambda: None)
_set_dynamo_callback = torch._C._dynamo.eval_frame.set_eval_frame

Tensor = torch.Tensor
_is_grad_enabled = torch.is_grad_enabled

DEFAULT_RECOMPILE_LIMIT = 8


CACHE_MODES = ("guarded", "same input")
# Captures run one at a time in a process (capture is Python-bound, so this costs little): two
# jitted wrappers of one module never install their capture views at once.
_COMPILE_LOCK = threading.RLock()


class CacheInfo(NamedTuple):
    """Cache statistics of one jitted function.

    ``reasons`` says, per compiled entry in order, why it was compiled: the first call, or
    what changed (an input's metadata, a guarded Python value, torch state) since an
    earlier entry was compiled. ``disk_hits`` counts the entries whose captured trace came from
    the on-disk cache (stored by an earlier process, or an earlier jit of the same program).
    """

    hits: int
    misses: int
    entries: int
    reasons: tuple[str, ...] = ()
    disk_hits: int = 0  # entries whose captured trace came from the on-disk cache


def _no_state_tensors() -> bool:
    """The metadata check of a module state that holds no tensors (a graph Dynamo handed over,
    whose parameters are its arguments): always passes, so the calls' fast paths stay open."""
    return True


def _versions_if(directory: str | None) -> dict:
    """What kept operation metadata depends on; not computed when nothing is kept."""
    return versions() if directory is not None else {}


def _positional_names(fn) -> list[str]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    names = []
    for p in signature.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return names


@contextlib.contextmanager
def _garbage_collection_paused():
    """Compiling allocates many small objects that live until it ends; Python's cyclic
    collector would walk them again and again (a third of capture time on a transformer).
    Cycles made meanwhile are collected after it is turned back on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _fits(compiled: Compiled, key) -> bool:
    """Whether ``key`` differs from the key a symbolic entry was compiled for only where it is symbolic."""
    return fits(compiled.key, compiled.symbolic_dims, key, compiled.symbolic_ints, compiled.symbolic_strides)


class ThunderFunction(LastEntryPaths):
    """A function compiled by ``thunder_core.jit``; call it like the original."""

    def __init__(
        self,
        fn,
        *,
        recompile_limit: int = DEFAULT_RECOMPILE_LIMIT,
        state=None,
        job=None,
        cache: str = "guarded",
        guard_root=None,
        signature_of=None,
        reuse_blocks: bool = True,
        dynamic: bool | None = None,
        capture_blocks_once: bool = False,
        arguments: dict | None = None,
        remake=None,
        recompiles: bool = False,
    ):
        check_dynamic(dynamic)
        if cache not in CACHE_MODES:
            raise ValueError(
                f"thunder_core.jit: cache={cache!r} is not one of {', '.join(map(repr, CACHE_MODES))}"
            )
        self._fn = fn
        self._job = job
        self._options = {
            "recompile_limit": recompile_limit,
            "job": job,
            "cache": cache,
            "reuse_blocks": reuse_blocks,
            "dynamic": dynamic,
            "capture_blocks_once": capture_blocks_once,
        }
        self._dynamic = dynamic
        # The first program counts as a recompile (compile_in_background="recompiles"): the
        # torch.compile front end's part for a frame Dynamo compiled again.
        self._first_is_recompile = recompiles
        # What the program specialized, not tried symbolic again: (tensor index, dim), (int leaf
        # position, None) and (tensor index, "strides").
        self._fixed_dims: set[tuple] = set()
        self._arguments = arguments  # thunder_core.jit's arguments, for pickling
        self._remake = remake  # fn -> a new ThunderFunction of it (a module's bound method: jit_method)
        self._recompile_limit = recompile_limit
        self._state = state  # for modules: supplies parameters and buffers as extra inputs
        self._guarded = cache == "guarded"
        self._reuse_blocks = reuse_blocks
        self._capture_blocks_once = capture_blocks_once
        self._guard_root = fn if guard_root is None else guard_root
        # key -> (guard check or None, callable, Compiled): the entry tried first for that key.
        self._cache: dict[tuple, tuple] = {}
        self._variants: dict[tuple, list[Compiled]] = {}  # key -> every entry compiled for it
        self._entries: list[Compiled] = []
        self._descriptions: list[dict[str, str]] = []
        self._names = _positional_names(fn if signature_of is None else signature_of)
        self._hits = 0
        self._misses = 0
        self._rebinds = 0  # misses served by an entry re-validated for replaced submodules
        self._disk_hits = 0
        self._last: Compiled | None = None
        self._warned = False
        self._eager_reason: str | None = None  # set when the program cannot be guarded cheaply
        # One thread at a time compiles (the cache and the module's capture view are shared).
        self._compile_lock = _COMPILE_LOCK
        # (grad mode, argument count, exact check of the tensors' metadata, entry): the last all-tensor call's entry,
        # tried before the key is built (``_remember_fast``); reset whenever the cache changes.
        self._fast: tuple | None = None
        self._fast_checks: dict[tuple, object] = {}  # key -> its compiled metadata check
        # The last call's entry when its arguments were not all tensors (``_remember_structured``).
        self._fast_structured: StructuredEntry | None = None
        self._state_known: tuple | None = None  # (count, metadata check, key part) of the state's tensors
        self._warned_torch_func = False
        functools.update_wrapper(self, fn, updated=())

    def _under_torch_func(self, args, kwargs):
        """A torch.func transform is active: its wrapped tensors need PyTorch's own operations
        (a compiled program would read their storage, which they have none of). Run the
        original function, and say so once."""
        if not self._warned_torch_func:
            self._warned_torch_func = True
            warnings.warn(
                f"thunder_core.jit: {_display_name(self._guard_root)} is called inside a torch.func transform "
                "(grad, vjp, jvp, vmap, ...), so it runs eagerly, uncompiled. thunder_core.grad, vjp and jvp "
                "take the same arguments and compile the transformed function (docs/functional.md).",
                stacklevel=3,
            )
        return self._fn(*args, **kwargs)

    def _outside_dynamo(self, args, kwargs):
        """Called from a function torch.compile compiles (Hugging Face's ``generate`` compiles the
        forward by itself on CUDA with a static cache): Dynamo does not trace into this call (see
        ``_torchdynamo_disable`` below) and, as ``torch.compiler.disable`` does, its frame callback
        is off while the compiled program runs, so it compiles none of thunder-core's own frames."""
        prior = _set_dynamo_callback(None)
        try:
            return self(*args, **kwargs)
        finally:
            _set_dynamo_callback(prior)

    def __call__(self, *args, **kwargs):
        # The hot path: a key from the inputs' metadata, one dict lookup, the guard, one call.
        if _recorders.stack:  # called while another jitted function is being captured: inline
            return self._fn(*args, **kwargs)
        if _dynamo_callback() is not None:  # called from a torch.compile'd function: Dynamo stays out
            return self._outside_dynamo(args, kwargs)
        if _torch_func_level() is not None:  # inside torch.func.grad / vmap / ...: eagerly, as they need
            return self._under_torch_func(args, kwargs)
        fast = self._fast  # the entry of the last call, if all its arguments were tensors
        if fast is not None and not kwargs and fast[0] is _is_grad_enabled():
            state = self._state
            leaves = args if state is None else None if state.key() != fast[4] else (*args, *state.tensors())
            if leaves is not None and len(leaves) == fast[1] and fast[2](*leaves):
                entry = fast[3]
                compiled = entry[2]
                if (entry[0] is None or entry[0]() is None) and (
                    not compiled.symbolic or compiled.size_guard(leaves)
                ):
                    self._hits += 1
                    self._last = compiled
                    return entry[1](*leaves)
        structured = self._fast_structured  # the last call's entry, if its arguments were not all tensors
        if structured is not None and structured.grad_mode is _is_grad_enabled():
            leaves = self._structured_hit(structured, args, kwargs)
            entry = structured.entry
            if leaves is not None and (entry[0] is None or entry[0]() is None):
                self._hits += 1
                compiled = self._last = entry[2]
                if compiled.epilogue is not None:
                    return compiled.epilogue(entry[1](*leaves), args, kwargs)
                return entry[1](*leaves)
        key = [_is_grad_enabled()]
        if not kwargs and self._state is None:
            for a in args:
                if not isinstance(a, Tensor):
                    break
                key.append(a.shape)
                key.append(a.stride())
                key.append(a.dtype)
                key.append(a.device)
                key.append(a.requires_grad)
            else:
                key = tuple(key)
                entry = self._cache.get(key)
                if entry is not None and (entry[0] is None or entry[0]() is None):
                    self._hits += 1
                    compiled = self._last = entry[2]
                    if compiled.epilogue is not None:  # it returns objects it creates: made on every call
                        return compiled.epilogue(entry[1](*args), args, kwargs)
                    self._remember_fast(key, entry, args)
                    return entry[1](*args)
                return self._miss(key, args, args, kwargs)
            key = [key[0]]
        key, leaves = self._key(key, args, kwargs)
        entry = self._cache.get(key)
        if entry is not None and (entry[0] is None or entry[0]() is None):
            self._hits += 1
            compiled = self._last = entry[2]
            if compiled.epilogue is not None:  # argument objects: changed, or returned
                if not self._structured_is_current(structured, entry):
                    self._remember_structured(key, entry, compiled, args, kwargs)
                return compiled.epilogue(entry[1](*leaves), args, kwargs)
            if (
                not kwargs
                and self._state is not None
                and len(leaves) == len(args) + len(self._state.slots)
                and all(isinstance(a, Tensor) for a in args)
            ):
                self._remember_fast(key, entry, leaves, self._state.key())
            elif not self._structured_is_current(structured, entry):
                self._remember_structured(key, entry, compiled, args, kwargs)
            return entry[1](*leaves)
        return self._miss(key, leaves, args, kwargs)

    # Dynamo, tracing a function that calls this one, calls it as it is instead of tracing into
    # it (what torch.compiler.disable marks; read by Dynamo, so torch._dynamo is not imported here)
    __call__._torchdynamo_disable = True
    __call__._torchdynamo_disable_msg = "a thunder_core.jit function runs its own compiled program"

    def _key(self, key: list, args, kwargs) -> tuple[tuple, list]:
        leaves: list = []
        seen: dict = {}
        key.append(len(args))
        names = self._names
        for i, a in enumerate(args):
            add_to_key(a, key, leaves, names[i] if i < len(names) else f"args[{i}]", 0, seen)
        if kwargs:
            key.append(tuple(kwargs))
            for name, value in kwargs.items():
                add_to_key(value, key, leaves, name, 0, seen)
        if self._state is not None:
            key.append(self._state.key())
            key.append(self._state_part(self._state.tensors(), leaves))
        return tuple(key), leaves

    def _state_part(self, tensors: list, leaves: list) -> tuple:
        """The parameters' and buffers' part of a key, as one tuple; their tensors go to ``leaves``.

        Their metadata is read again only when PyTorch's own check (``tensor_metadata_check``, one
        C++ call) says it changed since the last call: a forward called with keyword arguments (a
        Hugging Face decoding step) skips walking every parameter.
        """
        known = self._state_known
        if known is not None and len(tensors) == known[0] and known[1](*tensors):
            leaves.extend(tensors)
            return known[2]
        part: list = []
        for t in tensors:  # real tensors, also while another thread captures
            add_to_key(t, part, leaves, "state")
        check = tensor_metadata_check(tuple(tensors)) if tensors else _no_state_tensors
        self._state_known = None if check is None else (len(tensors), check, tuple(part))
        return tuple(part)

    def _describe(self, args, kwargs) -> dict[str, str]:
        out = {"grad mode": "enabled" if torch.is_grad_enabled() else "disabled"}
        for i, a in enumerate(args):
            describe(a, self._names[i] if i < len(self._names) else f"args[{i}]", out)
        for k, v in kwargs.items():
            describe(v, k, out)
        if self._state is not None:
            out.update(self._state.describe())
        return out

    def _why_recompile(self, key, leaves, description: dict[str, str]) -> str:
        """What changed since an earlier entry: a guarded value under the same key, else a size
        guard of a symbolic entry, else the inputs."""
        variants = self._variants.get(key)
        if variants:
            latest = variants[-1]
            failure = latest.guard.check() if latest.guard is not None else None
            if failure is not None:
                return latest.guard.describe(failure)
        for compiled in reversed(self._entries):
            if compiled.size_guard is not None and _fits(compiled, key) and not compiled.size_guard(leaves):
                return f"size guard failed: {compiled.size_guard.failing(leaves)}"
        if not self._descriptions:
            return "first call"
        previous = self._descriptions[-1]
        changes = [
            f"{path}: {previous.get(path, '(absent)')} -> {description.get(path, '(absent)')}"
            for path in sorted(set(previous) | set(description))
            if previous.get(path) != description.get(path)
        ]
        return "; ".join(changes) or "inputs changed"

    def _miss(self, key, leaves, args, kwargs):
        with self._compile_lock:
            return self._miss_locked(key, leaves, args, kwargs)

    def _miss_locked(self, key, leaves, args, kwargs):
        self._misses += 1
        for compiled in reversed(self._variants.get(key, ())):
            if compiled.guard is None or compiled.guard.check() is None:
                return self._use(args, kwargs, key, compiled, leaves)
        if self._state is not None:
            if self._state.refresh():  # parameters, buffers or submodules were added, removed or replaced
                key, leaves = self._key([key[0]], args, kwargs)
                for compiled in reversed(self._variants.get(key, ())):
                    if compiled.guard is None or compiled.guard.check() is None:
                        return self._use(args, kwargs, key, compiled, leaves)
            rebound = self._rebind(key)
            if rebound is not None:
                return self._use(args, kwargs, key, rebound, leaves)
        symbolic = self._symbolic_entry(key, leaves)
        if symbolic is not None:
            self._variants.setdefault(key, []).append(symbolic)
            return self._use(args, kwargs, key, symbolic, leaves)
        description = self._describe(args, kwargs)
        reason = self._why_recompile(key, leaves, description)
        if len(self._entries) >= self._recompile_limit:
            self._warn_recompiles(reason)
            return self._fn(*args, **kwargs)
        if self._eager_reason is not None:
            return self._fn(*args, **kwargs)
        try:
            compiled = self._compile(args, kwargs, key, leaves)
        except TooMuchState as error:
            self._eager_reason = str(error)
            warnings.warn(
                f"thunder_core.jit: {error}; {_root_name(self._guard_root)} runs eagerly, uncompiled. Pass large "
                "state as tensors, or use thunder_core.jit(..., cache='same input') if nothing but the inputs "
                "changes between calls.",
                stacklevel=3,
            )
            return self._fn(*args, **kwargs)
        compiled.reason = "; ".join(
            part for part in (reason, compiled.sizes_note, compiled.disk_note) if part
        )
        self._variants.setdefault(key, []).append(compiled)
        self._entries.append(compiled)
        self._descriptions.append(description)
        return self._use(args, kwargs, key, compiled, leaves)

    def _rebind(self, key) -> Compiled | None:
        """An entry for ``key`` that holds for the module tree as it is now, its guard re-made.

        Replacing submodules by equal ones (``set_kv_cache`` builds new cache modules) fails
        only the identity checks of those submodules; the entry is reused when a fresh walk of
        the tree pins down everything else the same (``thunder_core.jit.rebind``).
        """
        variants = []
        for compiled in self._variants.get(key, ()):
            if compiled.captured_guard is None:
                continue
            failures = compiled.guard.failures()
            tokens, tree = compiled.guard_tokens, compiled.guard_tree_checks
            if failures and all(i < tree and tokens[i][0] == "module" for i, _ in failures):
                variants.append((compiled, failures))
        if not variants:
            return None
        builder = GuardBuilder()
        builder.program, builder.program_slot = self, _program_slot(self._fn, self._guard_root)
        builder.root_state_modules = self._state.module_ids()
        builder.ambient_state()
        try:
            builder.contents(self._guard_root, _root_name(self._guard_root))
        except TooMuchState:
            return None
        builder.mark_tree_walked()
        for compiled, failures in reversed(variants):
            if rebind(compiled.guard_tokens, compiled.guard_tree_checks, failures, builder):
                compiled.guard = CompositeGuard(builder.build(), compiled.captured_guard())
                compiled.guard_tokens = builder.tokens
                self._rebinds += 1
                return compiled
        return None

    def _symbolic_entry(self, key, leaves) -> Compiled | None:
        """A compiled entry with symbolic sizes that holds for this call, if one does."""
        for compiled in reversed(self._entries):
            if (
                compiled.size_guard is not None
                and _fits(compiled, key)
                and (compiled.guard is None or compiled.guard.check() is None)
                and compiled.size_guard(leaves)
            ):
                return compiled
        return None

    def _dims_to_make_symbolic(self, key, leaves):
        """What this compile makes symbolic (``thunder_core.jit.dynamic.to_make_symbolic``)."""
        arguments = len(leaves) - (len(self._state.slots) if self._state is not None else 0)
        return to_make_symbolic(self._dynamic, self._entries, key, leaves, arguments, self._fixed_dims)

    def _compile(self, args, kwargs, key, leaves) -> Compiled:
        config = self._job.config if self._job is not None else None
        if self._job is not None and self._state is not None and self._state.slots:
            _model_compile_starting(self._job.executors)
        mode = config.compile_in_background if config is not None else "never"
        recompile = bool(self._entries) or self._first_is_recompile
        background = wants_background(mode, recompile)
        # a recompile with fixed sizes compiles its regions at its second call (executors.second_call)
        later = (
            recompile
            and not background
            and config is not None
            and config.recompiled_regions == "at_second_call"
            # a pass over the lowered program (CUDA graphs) would keep what the first call ran
            and not (self._job is not None and self._job.passes.get("after_executors"))
        )
        progress_mode = config.progress if config is not None else "auto"
        with (
            _garbage_collection_paused(),
            compiling_in_background(background),
            compiling(_display_name(self._guard_root), progress_mode),
            foreground_compile(),
        ):
            dims, ints, strides = self._dims_to_make_symbolic(key, leaves)
            failed = ""
            if dims or ints or strides:
                from thunder_core.capture.symbolic import SymbolicSizes

                tried = {(t, d) for t, ds in dims.items() for d in ds} | {(p, None) for p in ints}
                tried |= {(t, "strides") for t in strides}
                sizes = SymbolicSizes(by_position(dims, leaves), ints, tensor_positions(strides, leaves))
                # An FX graph (the front end's part) runs no user Python: Dynamo answered its questions.
                sizes.user_python = not isinstance(self._guard_root, torch.fx.GraphModule)
                try:
                    compiled = self._compile_now(args, kwargs, key, sizes)
                except TooMuchState:
                    raise
                except Exception as error:  # noqa: BLE001 - compiled with fixed sizes instead, said in reasons
                    failed = f"sizes fixed: compiling them symbolic failed ({type(error).__name__}: {error})"
                    self._fixed_dims |= tried  # not tried again
                else:
                    names = [getattr(p, "name", "?") for p in compiled.traces[0].inputs]
                    described = describe_dims(
                        by_position(dims, leaves), names, ints, tensor_positions(strides, leaves)
                    )
                    if compiled.size_guard.is_symbolic:
                        kept = sizes.symbolic_ints()  # an int the program fixed (range(n)) stays fixed
                        self._fixed_dims |= {(p, None) for p in ints - kept}
                        ints = ints & kept
                        compiled.key, compiled.symbolic_dims, compiled.symbolic_ints = key, dims, ints
                        compiled.symbolic_strides, compiled.symbolic = strides, True
                        compiled.sizes_note = f"symbolic sizes: {described}"
                        return compiled
                    # The program fixed every one of them (int(x.shape[0]), a size it compares
                    # for equality): later sizes of these dims compile as they are, not tried again.
                    self._fixed_dims |= tried
                    compiled.key = key
                    compiled.sizes_note = f"sizes fixed: the program specializes {described}"
                    return compiled
            calls = (
                ProgramCalls(lambda: compiling(_display_name(self._guard_root), progress_mode))
                if later
                else None
            )
            with compiling_at_second_call(calls):
                compiled = self._compile_now(args, kwargs, key)
            compiled.key, compiled.sizes_note = key, failed
            if calls is not None:
                compiled.callable = calls.counting(compiled.callable)
            return compiled

    def _compile_now(self, args, kwargs, key, symbolic_sizes=None, use_disk: bool = True) -> Compiled:
        builder = None
        if self._guarded:
            builder = GuardBuilder()
            builder.program, builder.program_slot = self, _program_slot(self._fn, self._guard_root)
            if self._state is not None:
                builder.root_state_modules = self._state.module_ids()
            builder.ambient_state()
            if symbolic_sizes is not None and symbolic_sizes.ints:
                builder.argument_ints_free(argument_containers((args, kwargs)))
            builder.contents(self._guard_root, _root_name(self._guard_root))
            builder.mark_tree_walked()
        disk, material, restored, note = None, None, None, ""
        not_stored = ""
        if builder is not None and symbolic_sizes is None and use_disk:
            disk, material, not_stored = self._disk_key(key, builder)
        if material is not None:
            restored, note = restore(disk, material, builder)
        directory = self._cache_dir()
        with job_cache_directory(directory), metadata_kept_in(directory, _versions_if(directory)):
            try:
                compiled = self._compile_function(args, kwargs, builder, symbolic_sizes, restored)
            except Exception:
                if restored is None:
                    raise
                # A stored trace that the transforms or executors of this process cannot take:
                # capture as if there were no entry (a failure of the program itself recurs there).
                return self._compile_now(args, kwargs, key, symbolic_sizes, use_disk=False)
        if builder is not None:
            aliased = builder.arguments_read_through_the_module() if symbolic_sizes is not None else None
            if aliased is not None and symbolic_sizes.ints:
                raise CaptureError(
                    f"an argument object the module also holds (as {aliased}) and the program reads through "
                    "it holds an int taken symbolic; its ints stay fixed"
                )
            compiled.guard = builder.build()
            compiled.guard_tokens = builder.tokens
            compiled.guard_tree_checks = builder.tree_checks
            compiled.captured_guard = functools.cache(builder.build_captured_part)  # built if rebinding
            if restored is None:  # a stored trace was captured by a process whose capture changed nothing
                check_side_effects(compiled, builder.namespaces)
        if restored is not None:
            self._disk_hits += 1
            note = "captured trace from the disk cache"
        elif material is not None:
            not_stored = save(disk, material, compiled, builder)
        if not_stored:
            compiled.notes.append(not_stored)
        compiled.disk_note = note
        return compiled

    def _compile_function(self, args, kwargs, builder, symbolic_sizes, restored) -> Compiled:
        return compile_function(
            self._fn,
            args,
            kwargs,
            positional_names=self._names,
            extra_inputs=self._state.named_tensors() if self._state is not None else (),
            extra_binder=self._state.binder if self._state is not None else None,
            job=self._job,
            guard_builder=builder,
            block_modules=self._block_modules() if symbolic_sizes is None else (),
            capture_blocks_once=self._capture_blocks_once,
            symbolic_sizes=symbolic_sizes,
            restored=restored,
        )

    def _cache_dir(self) -> str | None:
        config = self._job.config if self._job is not None else None
        return config.cache_dir if config is not None else None

    def _disk_key(self, key, builder) -> tuple[DiskCache | None, dict | None, str]:
        """The on-disk cache of this job and what this call's entry is keyed on; (None, None, why)
        when the cache is off or the call cannot be described across processes."""
        directory = self._cache_dir()
        config = self._job.config if self._job is not None else None
        if directory is None or config is None or not config.cache_traces:
            return None, None, ""
        disk = open_disk_cache(directory, "traces")
        if disk is None:
            return None, None, ""
        state = [name for *_, name in self._state.slots] if self._state is not None else []
        options = {k: v for k, v in self._options.items() if k != "job"}
        try:
            material = key_material(
                self._guard_root, self._fn, key, self._names, state, options, self._job, builder
            )
        except Exception as error:  # noqa: BLE001 - NotPersistable, or anything else: compiled without the disk cache
            return None, None, f"not stored in the disk cache: {error}"
        return disk, material, ""

    def _block_modules(self) -> list:
        if not self._reuse_blocks or not isinstance(self._guard_root, torch.nn.Module):
            return []
        from thunder_core.capture.blocks import repeated_blocks

        return repeated_blocks(self._guard_root)

    def _use(self, args, kwargs, key, compiled: Compiled, leaves):
        check = compiled.guard.check if compiled.guard is not None and len(compiled.guard) else None
        self._cache[key] = entry = (check, compiled.callable, compiled)
        self._fast = None
        self._fast_structured = None
        if kwargs or not all(isinstance(a, Tensor) for a in args):
            self._remember_structured(key, entry, compiled, args, kwargs)
        elif compiled.epilogue is None and compiled.symbolic:  # its next new size: no miss
            self._remember_all_tensors(key, entry, args, leaves)
        self._last = compiled
        if compiled.epilogue is not None:
            return compiled.epilogue(compiled.callable(*leaves), args, kwargs)
        return compiled.callable(*leaves)

    def _warn_recompiles(self, reason: str) -> None:
        if self._warned:
            return
        self._warned = True
        recent = [c.reason for c in self._entries[-3:]] + [reason]
        changed = "\n".join(f"  {r}" for r in dict.fromkeys(recent))
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        warnings.warn(
            f"thunder_core.jit: {name} was compiled {len(self._entries)} times (recompile_limit="
            f"{self._recompile_limit}); new input signatures and changed Python values now run eagerly, "
            f"uncompiled. What kept changing:\n{changed}\nKeep these stable, or raise recompile_limit in "
            "thunder_core.jit(...).",
            stacklevel=3,
        )

    def __deepcopy__(self, memo):
        """A copy compiles anew: the same function and options, an empty cache. A module's bound
        method is copied with its module (``copy.deepcopy(model)`` after ``model.forward = jit(model.forward)``)."""
        if self._remake is not None:
            return self._remake(copy.deepcopy(self._fn, memo))
        if self._state is not None:
            raise TypeError("copy the ThunderModule, not its forward")
        return ThunderFunction(self._fn, arguments=self._arguments, **self._options)

    def __reduce_ex__(self, protocol):
        if self._arguments is None:
            raise TypeError(f"{self!r} was not made by thunder_core.jit and cannot be pickled")
        if self._remake is not None:
            return (_remade, (self._remake, self._fn))
        return (ThunderFunction.from_arguments, (self._fn, self._arguments))

    @staticmethod
    def from_arguments(fn, arguments: dict) -> ThunderFunction:
        """``thunder_core.jit(fn, **arguments)`` for a function (also what unpickling calls)."""
        return ThunderFunction(
            fn, job=job_from_arguments(arguments), arguments=arguments, **jit_options(arguments)
        )

    @property
    def thunder_core_guard_root(self):
        """What guards walk when this jitted function is reached from another one's state."""
        return self._guard_root

    # Inspection.
    def cache_info(self) -> CacheInfo:
        return CacheInfo(
            self._hits,
            self._misses,
            len(self._entries),
            tuple(c.reason for c in self._entries),
            self._disk_hits,
        )

    def last_compiled(self) -> Compiled | None:
        return self._last


def _remade(remake, fn):
    return remake(fn)


def job_from_arguments(arguments: dict):
    """The job ``thunder_core.jit``'s arguments select, with the environment and the config file."""
    from thunder_core.plugins.config import resolve
    from thunder_core.plugins.job import build_job

    selection = {
        key: arguments.get(key)
        for key in ("executors", "plugins", "options", "disable", "select", "compile_in_background")
    }
    selection["cache_dir"] = arguments.get("cache_dir", DEFAULT_CACHE_DIR)
    selection["cache_traces"] = arguments.get("cache_traces")
    return build_job(resolve(**selection))


def jit_options(arguments: dict) -> dict:
    return {
        key: arguments[key]
        for key in ("recompile_limit", "cache", "reuse_blocks", "dynamic", "capture_blocks_once")
        if key in arguments
    }


def _display_name(root) -> str:
    """``GPT`` for a module, ``forward`` for a function: what a person calls it."""
    return type(root).__name__ if isinstance(root, torch.nn.Module) else _root_name(root)


def _program_slot(fn, root) -> tuple[object, str] | None:
    """Where a wrapper of a jitted module method would be installed: (the module, the method's
    name); None for anything else jitted."""
    if isinstance(fn, types.MethodType) and fn.__self__ is root and isinstance(root, torch.nn.Module):
        return root, fn.__func__.__name__
    return None


def _root_name(root) -> str:
    if isinstance(root, torch.nn.Module):
        return "model"
    return getattr(root, "__qualname__", None) or getattr(root, "__name__", None) or type(root).__qualname__


def _model_compile_starting(executors) -> None:
    """Let the job's fusion executors start their slow one-time set-up while a model is captured."""
    for executor in executors:
        starting = getattr(executor, "model_compile_starting", None)
        if starting is None:
            continue
        try:
            starting()
        except Exception:  # noqa: BLE001 - a set-up that fails fails again, and is reported, at the first region
            pass


def _dynamo_skips(*functions) -> None:
    """Dynamo runs these functions' frames as they are when a torch.compile'd function calls them
    (as ``torch._dynamo.eval_frame.skip_code`` does, through torch._C: Dynamo is not imported)."""
    eval_frame = torch._C._dynamo.eval_frame
    if not hasattr(eval_frame, "set_code_exec_strategy"):  # older torch: Dynamo traces them, then breaks
        return
    strategy = eval_frame._FrameExecStrategy(eval_frame._FrameAction.SKIP, eval_frame._FrameAction.DEFAULT)
    for function in functions:
        eval_frame.set_code_exec_strategy(function.__code__, strategy)


_dynamo_skips(ThunderFunction.__call__, ThunderFunction._outside_dynamo)
