"""Generated flatteners: the hot path of calls whose arguments are not all tensors.

A call with keyword arguments or argument objects (a Hugging Face decoding step: ``input_ids=``,
``past_key_values=`` a ``DynamicCache`` of layers of tensors) is looked up by a cache key that
``cache_key.add_to_key`` builds by walking every argument: a type test, a tuple and a few list
appends per value, and a shape, a stride tuple and three more fields per tensor. Once a call
has hit an entry, ``build_flattener`` turns that walk, for that call's structure, into straight
Python code: the same type, length, key and value tests in a fixed order, the leaves collected
in the key's order, and the tensors' metadata checked in one C++ call (PyTorch's
``TensorGuards``, as Dynamo checks its inputs), with the entry's symbolic dimensions (and the
strides of its symbolic tensors, which its size guard checks) left free. The flattener returns
the leaves, or None when anything differs from what the key would have matched: then the key is
built as before.

The flattener is at least as strict as the key: a test it makes that the key does not (a tensor
subclass, dispatch keys, a tensor reached twice) only sends a call the slow way. It reads only
exact lists, tuples and dicts with string keys, and objects through ``vars()``, as the key
does; subclasses of containers (which may iterate and index in their own ways), dicts with
other keys, and calls whose structure reaches the same list, dict or object twice
(``("same object as", n)`` in the key) are left to the key, and a call that reaches one twice
where the recorded one did not fails the flattener's identity test.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from thunder_core.capture.objects import is_argument_object
from thunder_core.jit.cache_key import _BY_IDENTITY, _NUMBER_TYPES, _VALUE_TYPES, float_part

Tensor = torch.Tensor
_SLICE_PARTS = (int, type(None))


class NotFlattenable(Exception):
    """The call holds something the generated code does not reproduce: the key serves it."""


class _Writer:
    def __init__(
        self,
        symbolic_dims: dict[int, frozenset[int]],
        symbolic_ints: frozenset[int] = frozenset(),
        free_strides: frozenset[int] = frozenset(),
    ):
        self.lines: list[str] = []
        self.constants: dict[str, object] = {}
        self.leaves: list[str] = []
        self.tensors: list[str] = []
        self.tensor_values: list[Tensor] = []
        self.walked: list[str] = []  # lists, dicts and objects: each reached once
        self.walked_ids: set[int] = set()
        self.symbolic_dims = symbolic_dims
        self.symbolic_ints = symbolic_ints  # leaf positions of ints whose value is left free
        self.free_strides = free_strides  # tensor indexes whose strides are left free
        self._names = 0

    def name(self) -> str:
        self._names += 1
        return f"v{self._names}"

    def constant(self, value) -> str:
        name = f"_c{len(self.constants)}"
        self.constants[name] = value
        return name

    def fail_unless(self, condition: str) -> None:
        self.lines.append(f"    if not ({condition}): return None")

    def assign(self, expression: str) -> str:
        var = self.name()
        self.lines.append(f"    {var} = {expression}")
        return var

    def once(self, x, var: str) -> None:
        if id(x) in self.walked_ids:
            raise NotFlattenable("the same container reached twice")
        self.walked_ids.add(id(x))
        self.walked.append(var)

    def value(self, x, var: str) -> None:
        """Code testing ``var`` as ``add_to_key`` keys ``x``, and collecting its leaves."""
        if isinstance(x, Tensor):
            self.fail_unless(f"isinstance({var}, Tensor)")
            self.leaves.append(var)
            self.tensors.append(var)
            self.tensor_values.append(x)
        elif type(x) in _VALUE_TYPES:
            if type(x) is int and len(self.leaves) in self.symbolic_ints:  # its size guard checks the value
                self.fail_unless(f"type({var}) is int")
            elif type(x) is float:
                self.fail_unless(
                    f"type({var}) is float and _float_part({var}) == {self.constant(float_part(x))}"
                )
            else:
                self.fail_unless(f"type({var}) is {self.constant(type(x))} and {var} == {self.constant(x)}")
            if type(x) in _NUMBER_TYPES:
                self.leaves.append(var)
        elif type(x) is slice:
            parts = (x.start, x.stop, x.step)
            if not all(isinstance(p, _SLICE_PARTS) for p in parts):
                raise NotFlattenable("a slice of other values")
            self.fail_unless(f"type({var}) is slice")
            for part, value in zip(("start", "stop", "step"), parts):  # the key refuses other types
                self.fail_unless(
                    f"type({var}.{part}) is {self.constant(type(value))} and {var}.{part} == {self.constant(value)}"
                )
        elif isinstance(x, _BY_IDENTITY):
            self.fail_unless(f"{var} is {self.constant(x)}")
        elif type(x) in (tuple, list):  # subclasses (their own __iter__, __getitem__) go by the key
            self.fail_unless(f"type({var}) is {type(x).__name__} and len({var}) == {len(x)}")
            if type(x) is list:
                self.once(x, var)
            for i, item in enumerate(x):
                self.value(item, self.assign(f"{var}[{i}]"))
        elif isinstance(x, (tuple, list)):
            raise NotFlattenable("a subclass of tuple or list")
        elif type(x) is dict:
            if not all(type(k) is str for k in x):  # keys of other types hash and compare in their own ways
                raise NotFlattenable("a dict with keys other than strings")
            self.fail_unless(f"type({var}) is dict and tuple({var}) == {self.constant(tuple(x))}")
            self.once(x, var)
            for k, item in x.items():
                self.value(item, self.assign(f"{var}[{self.constant(k)}]"))
        elif isinstance(x, dict):
            raise NotFlattenable("a subclass of dict")
        elif is_argument_object(x):
            self.fail_unless(f"type({var}) is {self.constant(type(x))}")
            self.once(x, var)
            attributes = self.assign(f"vars({var})")
            names = tuple(vars(x))
            self.fail_unless(f"tuple({attributes}) == {self.constant(names)}")
            for name, item in vars(x).items():
                self.value(item, self.assign(f"{attributes}[{self.constant(name)}]"))
        else:
            raise NotFlattenable(type(x).__qualname__)

    def tensor_check(self) -> Callable:
        """PyTorch's ``TensorGuards`` for the tensors met, symbolic dims and their strides left free."""
        return metadata_check(self.tensor_values, self.symbolic_dims, self.free_strides)


def metadata_check(
    tensors, symbolic_dims: dict[int, frozenset[int]], free_strides: frozenset[int] = frozenset()
) -> Callable:
    """``check(*tensors)``: PyTorch's ``TensorGuards`` (type, dispatch keys, dtype, device,
    requires_grad, sizes, strides) for these tensors, the dims in ``symbolic_dims`` (by tensor
    index) and every stride of those tensors left free. Raises ``NotFlattenable`` where PyTorch
    cannot make one (an internal API)."""
    sizes, strides = [], []
    for i, t in enumerate(tensors):
        dims = symbolic_dims.get(i, frozenset())
        sizes.append([None if d in dims else s for d, s in enumerate(t.shape)])
        strides.append([None] * t.dim() if dims or i in free_strides else list(t.stride()))
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides).check
    except (ImportError, RuntimeError, TypeError) as error:
        raise NotFlattenable(f"TensorGuards: {error}") from error


def build_flattener(
    args: tuple,
    kwargs: dict,
    symbolic_dims: dict[int, frozenset[int]] | None = None,
    symbolic_ints: frozenset[int] = frozenset(),
    free_strides: frozenset[int] = frozenset(),
) -> Callable[[tuple, dict], list | None] | None:
    """``flatten(args, kwargs)``: the leaves of a call with the structure and tensor metadata of
    this one (``symbolic_dims``: ``{tensor index: dims}`` left free; ``symbolic_ints``: the leaf
    positions of ints whose value is left free), else None; None when the call holds something
    it cannot test as the key does."""
    writer = _Writer(symbolic_dims or {}, symbolic_ints, free_strides)
    try:
        writer.fail_unless(f"len(a) == {len(args)} and len(k) == {len(kwargs)}")
        if kwargs:
            writer.fail_unless(f"tuple(k) == {writer.constant(tuple(kwargs))}")
        for i, x in enumerate(args):
            writer.value(x, writer.assign(f"a[{i}]"))
        for name, x in kwargs.items():
            writer.value(x, writer.assign(f"k[{writer.constant(name)}]"))
        if writer.tensors:
            writer.constants["_tensors_match"] = writer.tensor_check()
            writer.fail_unless(f"_tensors_match({', '.join(writer.tensors)})")
    except NotFlattenable:
        return None
    if len(writer.walked) > 1:
        ids = ", ".join(f"id({v})" for v in writer.walked)
        writer.fail_unless(f"len({{{ids}}}) == {len(writer.walked)}")
    source = "def flatten(a, k):\n" + "\n".join(writer.lines) + f"\n    return [{', '.join(writer.leaves)}]\n"
    namespace = {"Tensor": Tensor, "_float_part": float_part, **writer.constants}
    exec(compile(source, "<thunder_core flatten>", "exec"), namespace)
    flatten = namespace["flatten"]
    flatten.source = source
    return flatten
