"""``ThunderModule``: a jitted ``nn.Module`` that behaves like the original.

Parameters and buffers are inputs of the trace (so ``.to()``, optimizers and
``load_state_dict`` keep working on the original tensors); they are swapped for proxies
in the module's own ``_parameters``/``_buffers`` dicts only while the forward is captured.
"""

from __future__ import annotations

import copy
import sys
import threading
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from thunder_core.errors import CaptureError, ThunderCoreError
from thunder_core.jit.function import ThunderFunction, jit_options, job_from_arguments
from thunder_core.plugins.errors import PluginError


class ThreadView(dict):
    """A module's ``_parameters`` or ``_buffers`` while one thread captures its forward.

    The capturing thread sees the stand-ins in ``view``; every other thread sees the real tensors,
    so eager calls of the module and cached calls of its jitted forward in other threads run as
    usual. Writes from other threads reach the module's own dict too.
    """

    def __init__(self, original: dict):
        super().__init__(original)
        self.original = original
        self.thread = threading.get_ident()
        self.view: dict = {}

    def _mine(self) -> bool:
        return threading.get_ident() == self.thread

    def __getitem__(self, key):
        if self._mine() and key in self.view:
            return self.view[key]
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        if self._mine() and key in self.view:
            return self.view[key]
        return dict.get(self, key, default)

    def __setitem__(self, key, value) -> None:
        if self._mine() and key in self.view:
            self.view[key] = value
            return
        dict.__setitem__(self, key, value)
        self.original[key] = value

    def __delitem__(self, key) -> None:
        self.view.pop(key, None)
        dict.__delitem__(self, key)
        self.original.pop(key, None)

    def items(self):
        if not self._mine():
            return dict.items(self)
        return [(k, self.view.get(k, v)) for k, v in dict.items(self)]

    def values(self):
        return [v for _, v in self.items()]


def _readers(slots: list, modules: list) -> tuple:
    """Generated code reading the parameters and buffers in ``slots`` (``owner._parameters[name]``,
    the same lookups ``getattr(owner, kind)[attr]`` makes, without a loop) and the ``training`` flags
    of ``modules``: read on every call of a module's jitted forward."""
    names = {}
    tensors = ", ".join(f"_o{i}.{kind}[{repr(attr)}]" for i, (_, kind, attr, _) in enumerate(slots))
    names.update({f"_o{i}": owner for i, (owner, *_) in enumerate(slots)})
    flags = "".join(f"_m{i}.training, " for i in range(len(modules)))
    names.update({f"_m{i}": m for i, m in enumerate(modules)})
    source = f"def read_tensors():\n    return [{tensors}]\n\ndef read_training():\n    return ({flags})\n"
    exec(compile(source, "<thunder_core module state>", "exec"), names)
    return names["read_tensors"], names["read_training"]


def _held(tensors: dict) -> tuple[str, ...]:
    return tuple(name for name, tensor in tensors.items() if tensor is not None)


class _ModuleState:
    """The parameters and buffers of a module, as extra inputs of its jitted forward."""

    def __init__(self, module: nn.Module, read_now: bool = True):
        self.module = module
        self.slots: list = []  # (owner module, "_parameters" | "_buffers", attribute, full name)
        self._training: list[nn.Module] = []
        self._read_tensors, self._read_training = list, tuple  # until the first refresh: none
        self._structure = None
        self.extensions: list = []  # ModuleExtension objects of the job's plugins, in order
        if read_now:  # else on the first call (a module still being copied has no tree yet)
            self.refresh()

    def _current_structure(self) -> tuple:
        # the names of the parameters and buffers that hold a tensor: one set to None is no input
        return tuple(
            (id(owner), _held(owner._parameters), _held(owner._buffers), tuple(owner._modules))
            for owner in self.module.modules()
        )

    def refresh(self) -> bool:
        """Re-read the module tree; True if parameters, buffers or submodules changed since last time."""
        structure = self._current_structure()
        if structure == self._structure:
            return False
        self._structure = structure
        self.slots = []
        for prefix, owner in self.module.named_modules(remove_duplicate=False):
            for kind in ("_parameters", "_buffers"):
                for attr, tensor in getattr(owner, kind).items():
                    if tensor is not None:
                        self.slots.append((owner, kind, attr, f"{prefix}.{attr}" if prefix else attr))
        self._training = [m for _, m in self.module.named_modules()]
        self._read_tensors, self._read_training = _readers(self.slots, self._training)
        return True

    def module_ids(self) -> set[int]:
        """The modules whose parameters and buffers are inputs and whose ``training`` is in the key."""
        return {id(m) for m in self._training}

    def tensors(self) -> list[torch.Tensor]:
        """What the trace takes for the parameters and buffers (as the extensions' ``inputs`` give it)."""
        try:
            tensors = self._read_tensors()
        except KeyError:  # a parameter or buffer deleted since the last call
            self.refresh()
            tensors = self._read_tensors()
        if self.extensions:
            names = [name for *_, name in self.slots]
            for extension in self.extensions:
                tensors = extension.inputs(names, tensors)
        return tensors

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, t) for (*_, name), t in zip(self.slots, self.tensors())]

    def key(self) -> tuple:
        training = self._read_training()
        if not self.extensions:
            return training
        return (training, tuple(e.cache_key() for e in self.extensions))

    def describe(self) -> dict[str, str]:
        out = {"module.training": str(self.module.training)}
        for extension in self.extensions:
            out.update(extension.describe())
        for name, t in self.named_tensors():
            out[name] = (
                f"tensor {tuple(t.shape)} {t.dtype} on {t.device}, requires_grad={t.requires_grad}, strides {t.stride()}"
            )
        return out

    def _restore_references(self, originals: dict[int, torch.Tensor]) -> None:
        """Put the real tensors back where the forward kept references to its parameters.

        Some modules keep lists of their own parameters (``nn.LSTM._flat_weights``) and refresh
        them in forward; during capture they would be left holding the stand-ins.
        """
        for module in self.module.modules():
            for value in vars(module).values():
                if type(value) is list:
                    for i, item in enumerate(value):
                        if id(item) in originals:
                            value[i] = originals[id(item)]
                elif type(value) is dict:
                    for key, item in value.items():
                        if id(item) in originals:
                            value[key] = originals[id(item)]

    def _bound(self, proxies) -> list:
        """What the forward sees for each slot: the input proxies, as the extensions change them."""
        names = [name for *_, name in self.slots]
        seen = list(proxies)
        for extension in self.extensions:
            seen = list(extension.bind(names, seen))
            if len(seen) != len(names):
                raise TypeError(
                    f"{extension.name}: bind() returned {len(seen)} values for {len(names)} parameters and buffers"
                )
        return seen

    @contextmanager
    def binder(self, proxies):
        """While capturing, the forward (in this thread only) sees ``proxies`` as its parameters and buffers."""
        saved = [getattr(owner, kind)[attr] for owner, kind, attr, _ in self.slots]
        replaced = []
        seen = list(proxies)
        views: dict[tuple[int, str], tuple[nn.Module, str, ThreadView]] = {}
        try:
            seen = self._bound(proxies)
            for (owner, kind, attr, _), proxy in zip(self.slots, seen):
                found = views.get((id(owner), kind))
                if found is None:
                    found = views[(id(owner), kind)] = (owner, kind, ThreadView(owner.__dict__[kind]))
                    owner.__dict__[kind] = found[2]
                found[2].view[attr] = proxy
            yield
        finally:
            for (owner, kind, attr, name), proxy in zip(self.slots, seen):
                if getattr(owner, kind).get(attr) is not proxy:
                    replaced.append(f"{name} ({kind[1:-1]})")
            for owner, kind, view in views.values():
                owner.__dict__[kind] = view.original
            self._restore_references({id(p): t for p, t in zip(seen, saved)})
        if replaced:
            raise CaptureError(
                f"thunder_core.jit: the forward assigns a new tensor to {', '.join(replaced)}. A compiled "
                "trace cannot replay that assignment. Update the tensor in place instead "
                "(self.buf.copy_(new), self.count.add_(1)), or leave this module un-jitted."
            )


_OWN_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
              "_forward_hooks_always_called", "_backward_hooks", "_backward_pre_hooks")  # fmt: skip


def _instance_attribute(module: nn.Module, name: str) -> bool:
    """An attribute of this module object (a plain attribute, parameter, buffer or submodule)."""
    return any(
        name in table for table in (module.__dict__, module._parameters, module._buffers, module._modules)
    )


def _has_uninitialized_parameters(module: nn.Module) -> bool:
    return any(
        isinstance(tensor, nn.parameter.UninitializedTensorMixin)
        for tensor in [*module.parameters(), *module.buffers()]
    )


#: The plugin a job adds to trace a module whose parameters are DTensors (thunder-plugin-distributed).
DTENSOR_PLUGIN = "dtensor"


def _distributed_tensor(module: nn.Module) -> str | None:
    """The name of a DTensor parameter or buffer of ``module`` (``fully_shard``, ``parallelize_module``)."""
    tensor_module = sys.modules.get("torch.distributed.tensor")
    if tensor_module is None:  # never imported, so no DTensor exists (importing it costs ~2 s)
        return None
    DTensor = tensor_module.DTensor
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if isinstance(tensor, DTensor):
            return name
    return None


def _with_dtensor_plugin(module: nn.Module, arguments: dict, job):
    """A module whose parameters are DTensors is traced by the ``dtensor`` plugin, which the job
    gets when it is installed; plugins that change a plain module cannot apply to it."""
    name = _distributed_tensor(module)
    if name is None:
        return arguments, job
    changing = sorted({n.split(".")[0] for _, _, n in job.module_transforms}) if job is not None else []
    if changing == [DTENSOR_PLUGIN]:
        return arguments, job
    if changing:
        _refuse_distributed_tensors(
            module,
            f"the plugin(s) {changing} change a plain model, and this one is already sharded: leave them out, "
            f"and thunder_core.jit(model) traces it with the {DTENSOR_PLUGIN!r} plugin",
        )
    from thunder_core.plugins.manager import plugin_manager

    if DTENSOR_PLUGIN not in plugin_manager().names():
        _refuse_distributed_tensors(
            module,
            f"tracing DTensor parameters needs the {DTENSOR_PLUGIN!r} plugin: pip install thunder-plugin-distributed "
            "(or jit the plain model with plugins=['fsdp'] or plugins=['tensor-parallel'])",
        )
    plugins = [*(job.config.plugins if job is not None else ()), DTENSOR_PLUGIN]
    arguments = {**arguments, "plugins": plugins}
    return arguments, job_from_arguments(arguments)


def _refuse_distributed_tensors(
    module: nn.Module,
    way_out: str = f"jit the module itself (thunder_core.jit(model)), which traces them with the "
    f"{DTENSOR_PLUGIN!r} plugin of thunder-plugin-distributed; module plugins do not apply to a bound method",
) -> None:
    """Refuse a module with DTensor parameters, naming ``way_out``."""
    name = _distributed_tensor(module)
    if name is not None:
        raise CaptureError(
            f"thunder_core.jit: {name} is a DTensor (sharded by FSDP2's fully_shard or split by "
            f"parallelize_module); {way_out}."
        )


def jit_method(method, arguments: dict, copying: bool = False) -> ThunderFunction:
    """``thunder_core.jit(module.forward)``: the bound method of a module, compiled and cached as
    ``jit(module)`` is — the module's parameters and buffers are inputs of the trace (read from the
    module on every call) and the module tree is guarded — so ``model.forward =
    thunder_core.jit(model.forward)`` keeps ``model``'s hooks, its ``generate`` and its other methods."""
    module = method.__self__
    if not copying:
        _refuse_distributed_tensors(module)
    job = job_from_arguments(arguments)
    if job is not None and job.module_transforms:
        names = sorted({name.split(".")[0] for _, _, name in job.module_transforms})
        raise TypeError(
            f"thunder_core.jit: the plugin(s) {names} change the module itself; jit the module "
            "(thunder_core.jit(model, plugins=...)), not its bound method"
        )
    state = _ModuleState(module, read_now=not copying)
    return ThunderFunction(
        method,
        state=state,
        guard_root=module,
        signature_of=method,
        job=job,
        arguments=arguments,
        remake=lambda copied: jit_method(copied, arguments, copying=True),
        **jit_options(arguments),
    )


def _global_module_hooks() -> bool:
    """Whether PyTorch's global module hooks are registered (they run on every module's call)."""
    hooks = nn.modules.module
    return bool(
        hooks._global_forward_pre_hooks
        or hooks._global_forward_hooks
        or hooks._global_backward_pre_hooks
        or hooks._global_backward_hooks
    )


class ThunderModule(nn.Module):
    """The module returned by ``thunder_core.jit(module)``.

    ``parameters()``, ``state_dict()``, ``load_state_dict()``, ``train()/eval()`` and
    ``.to()`` act on the original module, with the original names; attribute access
    falls through to it.
    """

    def __init__(self, module: nn.Module, *, arguments: dict | None = None, **options):
        super().__init__()
        job = options.get("job")
        if job is None or not any(n.split(".")[0] == DTENSOR_PLUGIN for _, _, n in job.module_transforms):
            _refuse_distributed_tensors(module)
        self._model = module
        self._options = options
        self._arguments = arguments  # thunder_core.jit's arguments, for pickling
        extensions = []
        for transform, plugin_options, name in job.module_transforms if job is not None else ():
            try:
                extension = transform(module, plugin_options)
            except ThunderCoreError:
                raise
            except Exception as error:
                raise PluginError(
                    f"thunder_core.jit: the module transform {name} failed: {type(error).__name__}: {error}. "
                    f"Leave the plugin {name.split('.')[0]!r} out of this job, or report it to its maintainers."
                ) from error
            if extension is not None:
                extensions.append(extension)
        self._lazy = _has_uninitialized_parameters(module)
        self._state = _ModuleState(module)
        self._state.extensions = extensions
        self._forward = ThunderFunction(
            self._call_original, state=self._state, guard_root=module, signature_of=module.forward, **options
        )

    def __deepcopy__(self, memo):
        """An independent jitted module: a deep copy of the original module, compiled anew."""
        self._refuse_copy("copied")
        model = copy.deepcopy(self._model, memo)
        new = ThunderModule(model, arguments=self._arguments, **self._options)
        memo[id(self)] = new
        new.training = self.training
        for key in _OWN_HOOKS:  # hooks registered on the jitted module itself
            if getattr(self, key, None):
                setattr(new, key, copy.deepcopy(getattr(self, key), memo))
        return new

    def __reduce_ex__(self, protocol):
        """Pickled as the original module and jit's arguments; unpickling jits it again."""
        self._refuse_copy("pickled")
        if self._arguments is None:
            raise TypeError("this ThunderModule was not made by thunder_core.jit and cannot be pickled")
        return (ThunderModule.from_arguments, (self._model, self._arguments, self.training))

    @staticmethod
    def from_arguments(module: nn.Module, arguments: dict, training: bool | None = None) -> ThunderModule:
        """``thunder_core.jit(module, **arguments)`` (also what unpickling calls)."""
        arguments, job = _with_dtensor_plugin(module, arguments, job_from_arguments(arguments))
        jitted = ThunderModule(module, job=job, arguments=arguments, **jit_options(arguments))
        if training is not None:
            jitted.training = training
        return jitted

    def _refuse_copy(self, how: str) -> None:
        if self._state.extensions:
            names = sorted({type(e).__name__ for e in self._state.extensions})
            raise TypeError(
                f"thunder_core.jit: a module jitted with plugins that change it ({', '.join(names)}) cannot be "
                f"{how}: they transformed the original module when it was jitted. Copy the original module "
                "before jitting it, and jit the copy with the same plugins."
            )

    @property
    def thunder_core_guard_root(self) -> nn.Module:
        """What guards walk when this jitted module is reached from another one's state."""
        return self._model

    def _call_original(self, *args, **kwargs):
        return self._model(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        """Hooks registered on this jitted module run around the call. PyTorch's global module
        hooks (``register_module_forward_hook``, ``ModuleTracker``) run once per module, as
        without jit: on the original module, inside the program, not on this wrapper too."""
        if not _global_module_hooks():
            return super().__call__(*args, **kwargs)
        if self._backward_hooks or self._backward_pre_hooks:
            raise ThunderCoreError(
                "thunder_core.jit: a backward hook registered on the jitted module does not run together with "
                "PyTorch's global module hooks; register it on the original module before jitting it instead"
            )
        return self._call_with_own_forward_hooks(args, kwargs)

    def _call_with_own_forward_hooks(self, args: tuple, kwargs: dict):
        """``nn.Module.__call__`` with only this module's forward hooks, in PyTorch's order."""
        for hook_id, hook in self._forward_pre_hooks.items():
            if hook_id in self._forward_pre_hooks_with_kwargs:
                changed = hook(self, args, kwargs)
                if changed is not None:
                    if not (isinstance(changed, tuple) and len(changed) == 2):
                        raise RuntimeError(
                            f"forward pre-hook must return None or a tuple of (new_args, new_kwargs), but got {changed}."
                        )
                    args, kwargs = changed
            else:
                changed = hook(self, args)
                if changed is not None:
                    args = changed if isinstance(changed, tuple) else (changed,)
        try:
            result = self.forward(*args, **kwargs)
        except Exception:
            for hook_id, hook in self._forward_hooks.items():
                if hook_id in self._forward_hooks_always_called:
                    try:
                        if hook_id in self._forward_hooks_with_kwargs:
                            hook(self, args, kwargs, None)
                        else:
                            hook(self, args, None)
                    except Exception:  # noqa: BLE001 - the forward's own error is the one to raise
                        pass
            raise
        for hook_id, hook in self._forward_hooks.items():
            if hook_id in self._forward_hooks_with_kwargs:
                changed = hook(self, args, kwargs, result)
            else:
                changed = hook(self, args, result)
            if changed is not None:
                result = changed
        return result

    def calls_directly(self) -> bool:
        """Whether a call may go straight to the jitted function (``_forward``): nothing lazy to
        initialize and no hooks registered on this module itself."""
        return not (
            self._lazy
            or self._forward_hooks
            or self._forward_pre_hooks
            or self._backward_hooks
            or self._backward_pre_hooks
        )

    def forward(self, *args, **kwargs):
        if self._lazy:
            return self._initializing_call(*args, **kwargs)
        return self._forward(*args, **kwargs)

    def _initializing_call(self, *args, **kwargs):
        """Lazy modules (``nn.LazyLinear``) learn their parameters' shapes on their first call: that
        call runs eagerly, as it would without jit; once every parameter exists, calls compile."""
        out = self._model(*args, **kwargs)
        self._lazy = _has_uninitialized_parameters(self._model)
        if not self._lazy:
            self._state.refresh()
        return out

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_model"], name)

    def __setattr__(self, name: str, value) -> None:
        """Attributes of the original module are set on it (``jmodel.scale = t`` replaces its buffer,
        as ``torch.func.functional_call`` does); this wrapper's own attributes stay here."""
        modules = self.__dict__.get("_modules")
        model = modules.get("_model") if modules is not None else None
        if model is None or name in self.__dict__ or not _instance_attribute(model, name):
            super().__setattr__(name, value)  # this wrapper's own state (and __class__, properties)
        elif isinstance(value, torch.Tensor) and name in model._parameters:
            # A tensor in a parameter's place, as torch.func.functional_call swaps it in (a plain
            # tensor keeps the gradient path to the tensor given).
            model._parameters[name] = value
        else:
            setattr(model, name, value)

    @property
    def extensions(self) -> tuple:
        """The ``ModuleExtension`` objects of this module's plugins (``ddp``, ``fsdp``, ...)."""
        return tuple(self._state.extensions)

    @contextmanager
    def no_sync(self):
        """Skip gradient synchronisation across processes inside this context (gradient
        accumulation), like ``DistributedDataParallel.no_sync``; the plugins that synchronise
        (``ddp``, ``fsdp``) say what that means for them. Without such a plugin nothing is
        synchronised anyway and the context changes nothing."""
        with ExitStack() as stack:
            for extension in self._state.extensions:
                context = extension.no_sync()
                if context is not None:
                    stack.enter_context(context)
            yield

    def state_dict(self, *args, **kwargs):
        for extension in self._state.extensions:
            found = extension.state_dict(self._model, *args, **kwargs)
            if found is not None:
                return found
        return self._model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, **kwargs):
        for extension in self._state.extensions:
            result = extension.load_state_dict(self._model, state_dict, strict=strict)
            if result is not None:
                return result
        return self._model.load_state_dict(state_dict, strict=strict, **kwargs)

    def named_parameters(self, *args, **kwargs):
        return self._model.named_parameters(*args, **kwargs)

    def named_buffers(self, *args, **kwargs):
        return self._model.named_buffers(*args, **kwargs)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        """This module, then the original module's tree under the original names (the original
        module itself under the same prefix). Wrappers that look for themselves in the tree
        (FSDP2's ``fully_shard`` of a jitted block) find this module."""
        if memo is None:
            memo = set()
        if not remove_duplicate or self not in memo:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self
        yield from self._model.named_modules(memo, prefix, remove_duplicate)

    def __repr__(self) -> str:
        return f"ThunderModule({self._model!r})"
