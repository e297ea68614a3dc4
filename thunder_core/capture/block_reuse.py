"""Capturing a repeated block once: later blocks that would do the same bind into its operations.

A transformer's layers are N modules of one class. The first call of a layer's class in a
capture runs its Python and records its operations (a *template*); a later layer's call is
checked against the template without running its Python, and when nothing it could read
differs, the template's operations are copied with that layer's own parameters, buffers and
arguments in place of the first one's. A layer that differs is captured by running its Python,
as without reuse (and may become a template of its own).

Nothing that could change what the layer's Python does may differ, or the copy would be a
silent wrong result. Compared between the template's call and the layer's:

- the module trees: the same submodule names and classes, no instance ``forward``, no hooks on
  either; parameters and buffers of the same names and metadata (shape, strides, dtype,
  device, requires_grad);
- every other instance attribute of every submodule, and the plain class attributes of their
  classes (torch's left out), by value (numbers, strings, dtypes, and tuples, lists, dicts and
  plain objects of them, walked), other objects and tensors by identity. An attribute whose
  value differs is tolerated only when it is a number, string, bool or None that no code run
  during the template's call names (``block_idx`` set in ``__init__`` and never read by
  ``forward``), and only when no user code run during it reads attributes by computed names
  (``getattr``, ``vars``, ``__dict__``, ``setattr``, ...);
- the arguments: tensors by metadata and by which of them are the same tensor, everything else
  by value as above;
- the globals that the user code run during the template's call reads, with the attributes it
  reads right after them (``Settings.factor``), and torch's ambient state (grad mode, autocast,
  default dtype and device, the types of the active function modes); no global module hook may
  be registered.

The template itself must leave no trace outside its operations: it may not change an
attribute of any of its submodules, a global its code reads or an argument (a dict it writes
to), compared before and after its call; take Python objects other than tensors, numbers,
strings and containers of them as arguments, or return anything but those; call a closure of
the user's (its cells are not compared); or record random draws or other effects (each layer's
draw must be its own). In-place updates are copied onto the layer's own tensors.

What no comparison of state sees is code whose result depends on which module object runs it
(``id(self)``, ``self is model.layers[0]``, a dict keyed by module): that is why reuse is
opt-in (``jit(model, capture_blocks_once=True)``).
"""

from __future__ import annotations

import enum
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from thunder_core.capture.reads import (
    GLOBAL_MODULE_HOOKS,
    MODULE_HOOKS,
    OPAQUE_MODULES,
    CallHook,
    global_chains,
    is_user_code,
)
from thunder_core.ir.proxies import PROXY_TYPES, NumberProxy, ObjectProxy, TensorProxy
from thunder_core.ir.symbols import EFFECT, RANDOM, BoundSymbol
from thunder_core.ir.tree import leaves, tree_map

_MAX_NODES = 20_000
MAX_TEMPLATES = 4  # distinct kinds of one block class kept per capture (alternating layer types)
_WALK_DEPTH = 6  # how deep containers and plain objects reached from a block are compared

_BY_VALUE = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), torch.dtype,
             torch.device, torch.memory_format, torch.layout, torch.Size, enum.Enum)  # fmt: skip
# Names in user code that read attributes by computed name: any attribute may then be read.
_DYNAMIC_READS = frozenset({
    "getattr", "hasattr", "setattr", "vars", "dir", "__dict__", "__getattribute__", "attrgetter", "getmembers",
    "getattr_static", "__getstate__", "__reduce__", "__reduce_ex__", "asdict", "astuple", "copy", "deepcopy",
})  # fmt: skip
_MODULE_TABLES = frozenset({"_parameters", "_buffers", "_modules", *MODULE_HOOKS})


class _Different(Exception):
    """A value that makes two blocks differ."""


def _value(x, depth: int = 0, budget: list | None = None):
    """A comparable description of a Python value: by value where that is what code sees.
    More than ``_MAX_NODES`` values walked is a difference (too much to compare per layer)."""
    budget = [_MAX_NODES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise _Different("too much state to compare")
    if isinstance(x, _BY_VALUE):
        return (type(x), repr(x))
    if (
        depth >= _WALK_DEPTH
        or isinstance(x, (torch.Tensor, nn.Module, types.ModuleType, type))
        or callable(x)
        or type(x).__module__.split(".")[0] in OPAQUE_MODULES
    ):
        return ("id", id(x))
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(_value(v, depth + 1, budget) for v in x))
    if isinstance(x, dict):  # hook tables are OrderedDicts
        return (type(x), tuple((repr(k), _value(v, depth + 1, budget)) for k, v in x.items()))
    if isinstance(x, (set, frozenset)):
        return (type(x), tuple(sorted(repr(v) for v in x)))
    state = getattr(x, "__dict__", None)
    if isinstance(state, dict):
        # A plain object (a config): shared ones are the same object; its contents may still
        # change between layers, so they are compared too.
        return ("object", id(x), tuple((k, _value(v, depth + 1, budget)) for k, v in state.items()))
    return ("id", id(x))


def _dims(values) -> tuple:
    """Sizes or strides; a symbolic one by its expression (comparing SymInts would add guards)."""
    return tuple(str(v) if isinstance(v, torch.SymInt) else v for v in values)


def _tensor_metadata(t) -> tuple:
    if t is None:
        return (None,)
    return (_dims(t.shape), _dims(t.stride()), t.dtype, t.device, t.requires_grad)


def _module_state(block: nn.Module) -> dict[tuple[str, str], object]:
    """Every value of ``block``'s tree that its Python could read, by (submodule, attribute)."""
    state: dict[tuple[str, str], object] = {}
    for path, sub in block.named_modules(remove_duplicate=False):
        attributes = vars(sub)
        forward = attributes.get("forward")
        if (forward is not None and not getattr(forward, "records_a_block", False)) or any(
            attributes.get(h) for h in MODULE_HOOKS
        ):
            raise _Different(f"{path or 'the block'} has hooks or an instance forward")
        state[(path, "<class>")] = type(sub)
        state[(path, "<class attributes>")] = _class_attributes(type(sub))
        state[(path, "<modules>")] = tuple(attributes.get("_modules", {}))
        for table in ("_parameters", "_buffers"):
            names = tuple(attributes.get(table, {}))
            state[(path, table)] = tuple((n, _tensor_metadata(getattr(sub, n))) for n in names)
        for name, value in attributes.items():
            if name not in _MODULE_TABLES and name != "forward":
                state[(path, name)] = _value(value)
    return state


def _class_attributes(cls: type) -> tuple:
    """The plain values a module's own classes hold (``Settings``-like class attributes that a
    forward may read through ``self`` or change), torch's classes left out."""
    values = []
    for klass in cls.__mro__:
        if klass is object or klass.__module__.split(".")[0] == "torch":
            continue
        for name, value in vars(klass).items():
            plain = not callable(value) and not isinstance(value, (staticmethod, classmethod, property))
            if plain and not name.startswith("__"):
                values.append((klass.__qualname__, name, _value(value)))
    return tuple(values)


def _tensors(block: nn.Module) -> dict[tuple[str, str], object]:
    """The block's parameters and buffers as the capture sees them (proxies), by (submodule, name)."""
    found = {}
    for path, sub in block.named_modules(remove_duplicate=False):
        for table in ("_parameters", "_buffers"):
            for name in vars(sub).get(table, {}):
                value = getattr(sub, name)
                if value is not None:
                    found[(path, name)] = value
    return found


def _arguments(args: tuple, kwargs: dict, *, names: bool = False) -> tuple[tuple, list]:
    """A description of a call's arguments (tensors by metadata, and which of them are the same
    tensor) and its proxies, in order; with ``names``, each proxy's name too (to see a change)."""
    proxies = []
    first: dict[int, int] = {}

    def describe(x):
        if isinstance(x, PROXY_TYPES):
            proxies.append(x)
            same = first.setdefault(id(x), len(first))
            name = x.name if names else None
            if isinstance(x, TensorProxy):
                return ("tensor", _tensor_metadata(x), same, name)
            if isinstance(x, NumberProxy):
                return ("number", repr(x.value), same, name)
            return ("object", same, name)
        if isinstance(x, torch.Tensor):
            raise _Different("a real tensor argument")
        if isinstance(x, (tuple, list)):
            return (type(x), tuple(describe(v) for v in x))
        if isinstance(x, dict) and type(x) is dict:
            return (dict, tuple((repr(k), describe(v)) for k, v in x.items()))
        if isinstance(x, _BY_VALUE):
            return (type(x), repr(x))
        raise _Different(f"an argument of type {type(x).__name__}")

    return describe((args, kwargs)), proxies


def _returned_plainly(out) -> bool:
    return all(isinstance(x, PROXY_TYPES) or isinstance(x, _BY_VALUE) for x in leaves(out))


class _CodeRun:
    """Every code object entered while active, with the globals of the user code among them
    (``sys.setprofile``, chained to the profile function already installed)."""

    def __init__(self):
        self.codes: set = set()
        self.user_globals: dict = {}
        self.globals_before: dict = {}  # what each user code object read, as its first entry found it
        self.too_much = False
        self._previous = None

    def _profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code not in self.codes:
                self.codes.add(code)
                if is_user_code(code.co_filename):
                    self.user_globals[code] = frame.f_globals
                    try:
                        self.globals_before.update(_globals_read({code: frame.f_globals}))
                    except _Different:  # too much to compare: no template (never raised into the program)
                        self.too_much = True
        if self._previous is not None:
            return self._previous(frame, event, arg)
        return None

    def __enter__(self) -> _CodeRun:
        self._hook = CallHook(self._profile)
        self._previous = self._hook.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hook.__exit__()


def _modes() -> tuple:
    count = torch._C._len_torch_function_stack()
    return tuple(
        type(torch._C._get_function_stack_at(i)) for i in range(count)
    ), torch._C._len_torch_dispatch_stack()


def _global_hooks() -> bool:
    """Whether a module hook is registered for every module (it may treat layers differently)."""
    tables = torch.nn.modules.module
    return any(getattr(tables, name, None) for name in GLOBAL_MODULE_HOOKS)


def _ambient() -> object:
    from torch._C._dynamo.guards import GlobalStateGuard

    return GlobalStateGuard(), _modes()


def _same_ambient(before) -> bool:
    guard, modes = before
    return guard.check() and modes == _modes()


def _globals_read(code_globals: dict) -> dict[tuple, object]:
    """The values of the global names the user code run reads, and of the attributes read right
    after them (``Settings.factor``, ``config_module.SCALE``), walked as plain objects are."""
    values = {}
    for code, namespace in code_globals.items():
        for chain in global_chains(code):
            value = namespace.get(chain[0], _MISSING)
            values[(id(namespace), chain[:1])] = _value(value)
            for k, attribute in enumerate(chain[1:], start=2):
                if isinstance(value, types.ModuleType) and value.__name__.split(".")[0] in (
                    "torch",
                    "thunder_core",
                ):
                    break
                value = getattr(value, attribute, _MISSING)
                values[(id(namespace), chain[:k])] = _value(value)
    return values


_MISSING = object()


@dataclass
class Template:
    """One block call whose operations later calls of the same kind reuse."""

    state: dict
    arguments: tuple
    argument_proxies: list
    tensors: dict  # (submodule, name) -> the template's parameter and buffer proxies
    bound_symbols: list[BoundSymbol]
    inputs: list  # the template's block bound symbol inputs
    output: object
    tolerated: frozenset  # attribute names no code run during the call names
    code_globals: dict  # user code object run -> its globals
    globals_read: dict
    ambient: object


class BlockTemplates:
    """The templates of one capture, and the copies made from them."""

    def __init__(self):
        self._templates: dict[type, list[Template]] = {}

    def can_record(self, module: nn.Module) -> bool:
        return len(self._templates.get(type(module), ())) < MAX_TEMPLATES

    def matching(self, module: nn.Module, args: tuple, kwargs: dict) -> Template | None:
        for template in self._templates.get(type(module), ()):
            try:
                if self._matches(template, module, args, kwargs):
                    return template
            except _Different:
                continue
        return None

    def _matches(self, template: Template, module, args, kwargs) -> bool:
        arguments, _ = _arguments(args, kwargs)
        if arguments != template.arguments or _global_hooks() or not _same_ambient(template.ambient):
            return False
        state = _module_state(module)
        if state.keys() != template.state.keys():
            return False
        for key, value in state.items():
            if value != template.state[key] and not (
                key[1] in template.tolerated and _tolerable(value) and _tolerable(template.state[key])
            ):
                return False
        return _globals_read(template.code_globals) == template.globals_read

    def run_template(self, module: nn.Module, args: tuple, kwargs: dict, record: Callable):
        """``record()`` (the block's Python, run and recorded), kept as a template when later
        calls can reuse it. ``record`` returns ``(output, bound_symbols, inputs)``, and so does this."""
        try:
            arguments, argument_proxies = _arguments(args, kwargs)
            passed = _arguments(args, kwargs, names=True)[0]
            before = _module_state(module)
        except _Different:
            return record()
        if _global_hooks():
            return record()
        ambient = _ambient()
        run = _CodeRun()
        with run:
            recorded = record()
        out, bound_symbols, inputs = recorded
        try:
            globals_read = _globals_read(run.user_globals)
            changed = run.too_much or (
                _module_state(module) != before
                or globals_read != run.globals_before
                or _arguments(args, kwargs, names=True)[0] != passed  # a dict or list argument written to
            )
            # Closure cells are not compared (generated code, a dataclass's __init__, is not the user's).
            closures = any(code.co_freevars and code.co_filename != "<string>" for code in run.user_globals)
            if changed or closures or not _returned_plainly(out) or _has_effects(bound_symbols):
                return recorded
        except _Different:
            return recorded
        named = set()
        for code in run.codes:
            named.update(code.co_names)
            named.update(c for c in code.co_consts if isinstance(c, str))
        dynamic = any(_DYNAMIC_READS & set(code.co_names) for code in run.user_globals)
        attributes = {k[1] for k in before if not k[1].startswith("<") and k[1] not in _MODULE_TABLES}
        template = Template(
            state=before,
            arguments=arguments,
            argument_proxies=argument_proxies,
            tensors=_tensors(module),
            bound_symbols=bound_symbols,
            inputs=inputs,
            output=out,
            tolerated=frozenset() if dynamic else frozenset(attributes - named),
            code_globals=run.user_globals,
            globals_read=globals_read,
            ambient=ambient,
        )
        self._templates.setdefault(type(module), []).append(template)
        return recorded

    def copy(self, template: Template, module: nn.Module, args: tuple, kwargs: dict, recorder):
        """The template's operations on ``module``'s tensors and these arguments, with new
        proxies of ``recorder`` for what they compute: ``(output, bound_symbols, inputs)``."""
        _, proxies = _arguments(args, kwargs)
        mapping: dict[int, object] = {}
        for old, new in zip(template.argument_proxies, proxies):
            mapping[id(old)] = new
        tensors = _tensors(module)
        for key, old in template.tensors.items():
            mapping[id(old)] = tensors[key]

        def fresh(bsyms: list[BoundSymbol]) -> None:
            for b in bsyms:
                for p in b.flat_outputs():
                    if id(p) not in mapping:
                        mapping[id(p)] = _fresh_like(p, recorder)
                fresh(b.subsymbols)

        for p in template.inputs:  # what every layer reads alike (updated in place, say) stays itself
            mapping.setdefault(id(p), p)
        fresh(template.bound_symbols)
        bound_symbols = [b.substitute(mapping) for b in template.bound_symbols]
        inputs = [mapping.get(id(p), p) for p in template.inputs]
        output = tree_map(lambda x: mapping.get(id(x), x), template.output)
        return output, bound_symbols, inputs


def _has_effects(bsyms: list[BoundSymbol]) -> bool:
    """A random draw or another effect, which each layer must do for itself; an update of its
    arguments in place is copied like any operation (onto the layer's own tensors)."""
    return any(b.symbol.tags & {RANDOM, EFFECT} or _has_effects(b.subsymbols) for b in bsyms)


def _tolerable(value) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and value[0] in (int, float, str, bool, type(None))


def _fresh_like(p, recorder):
    if isinstance(p, TensorProxy):
        copy = recorder.new_proxy(p.shape, p.dtype, p.device, p.requires_grad, p.stride())
        for key, value in vars(p).items():
            if key != "_proxy_name":
                setattr(copy, key, value)
        return copy
    if isinstance(p, NumberProxy):
        return NumberProxy(recorder.namer(), p.value)
    if isinstance(p, ObjectProxy):
        return ObjectProxy(recorder.namer())
    return p
