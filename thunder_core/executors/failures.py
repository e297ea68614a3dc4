"""An executor's failure is not the user's: failed compiles and failed first runs fall back to torch.

When an executor raises while compiling a region (anything, not only ``RegionNotSupported``)
or while running a region or an implementation for the first time, that work goes back to
the torch executor, a warning names the executor, the operations and the error (once per
executor, operations and error type), and ``explain`` shows it. A first run that fails in
operations with an effect (an in-place update, a random draw, a hook) is not run again: it may
have applied part of its effect already, so it raises ``ExecutorFailure``. Strict mode
(``THUNDER_CORE_STRICT=1`` or ``strict = true`` in the config) raises ``ExecutorFailure``
instead. Strictness is per compilation (a context variable), never state on an executor.

Given the operations that failed, the warning (or the strict-mode error) also names a
reproducer script, written by the function ``thunder_core.repro`` registers here.
"""

from __future__ import annotations

import contextvars
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from thunder_core.errors import ThunderCoreError

_strict: contextvars.ContextVar[bool] = contextvars.ContextVar("thunder_core_strict", default=False)
_options: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "thunder_core_executor_options", default=None
)
_warned: set[tuple] = set()
_repro_writers: list[Callable] = []  # (executor, bound symbols, error, options) -> path or None


def register_repro_writer(writer: Callable) -> None:
    """Called with ``(executor name, bound symbols, error, executor options)`` for each failure
    that is reported; returns the path of a reproducer it wrote, or None."""
    _repro_writers[:] = [writer]


class ExecutorFailure(ThunderCoreError):
    """An executor raised while compiling or running its part of a trace (strict mode)."""


@contextmanager
def strictness(strict: bool, options: dict | None = None) -> Iterator[None]:
    """Make executor failures errors (True) or warnings with a fallback (False) in this block;
    ``options`` (executor name -> its options) go into the reproducers of its failures."""
    token = _strict.set(strict)
    options_token = _options.set(options)
    try:
        yield
    finally:
        _options.reset(options_token)
        _strict.reset(token)


def _reproducer(executor: str, bound_symbols, error: BaseException) -> str:
    """ " A reproducer: PATH." for the failure, or ""."""
    if not bound_symbols or not _repro_writers:
        return ""
    path = _repro_writers[0](executor, list(bound_symbols), error, (_options.get() or {}).get(executor, {}))
    return f" A reproducer: {path}" if path else ""


def strict() -> bool:
    """Whether executor failures are errors in the compilation running now."""
    return _strict.get()


def report_failure(
    executor: str, when: str, operations: str, error: BaseException, bound_symbols=None
) -> str:
    """Raise in strict mode; else warn once and return the reason ``explain`` shows.
    ``bound_symbols``: the operations that failed, for a reproducer."""
    reason = f"{executor} failed {when}: {type(error).__name__}: {error}"
    if _strict.get():
        raise ExecutorFailure(
            f"{reason} (operations: {operations}); strict mode is on."
            + _reproducer(executor, bound_symbols, error)
        ) from error
    key = (executor, when, operations, type(error))
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"thunder_core: executor {executor!r} failed {when} ({operations}): {type(error).__name__}: "
            f"{error}. These operations run with the torch executor instead. Set THUNDER_CORE_STRICT=1 to "
            f"make this an error, or leave {executor!r} out of the job (THUNDER_CORE_DISABLE={executor})."
            + _reproducer(executor, bound_symbols, error),
            RuntimeWarning,
            stacklevel=2,
        )
    return reason


class FirstCall:
    """Calls ``fn``; if its first call raises, calls ``fallback()``'s result from then on.

    After the first successful call the generated code calls ``fn`` directly: ``attach``
    records where the generated code looks this object up (codegen calls ``attach_to_namespace``), and the first success rebinds it.
    """

    def __init__(
        self,
        fn: Callable,
        make_fallback: Callable[[], Callable],
        executor: str,
        operations: str,
        impure: bool = False,
        bound_symbols=None,
    ):
        self.fn = fn
        self._bound_symbols = bound_symbols  # the operations, for a reproducer of a failure
        self._impure = impure  # the operations update a tensor in place, draw random numbers, call a hook
        self._make_fallback = make_fallback
        self._executor = executor
        self._operations = operations
        self._strict = _strict.get()
        self._options = _options.get()
        self._slots: list[tuple[dict, str]] = []
        self.failure: str | None = None
        self.__name__ = getattr(fn, "__name__", "executor_call")

    def __getattr__(self, name: str):
        # Attributes of the executor's compiled object (e.g. a kernel's ``source``) read through.
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)

    def attach_to_namespace(self, namespace: dict, name: str) -> None:
        self._slots.append((namespace, name))

    def _rebind(self, target: Callable) -> None:
        for namespace, name in self._slots:
            if namespace.get(name) is self:
                namespace[name] = target

    def __call__(self, *args, **kwargs):
        try:
            result = self.fn(*args, **kwargs)
        except Exception as error:
            if self._impure:
                raise ExecutorFailure(
                    f"executor {self._executor!r} failed on its first run of operations that act beyond their "
                    f"outputs ({self._operations}): {type(error).__name__}: {error}. It may have applied part of "
                    "that effect already (an in-place update, a random draw), so running the operations again "
                    f"with torch could apply it twice. Leave {self._executor!r} out of the job "
                    f"(THUNDER_CORE_DISABLE={self._executor}) and report this to its maintainers."
                ) from error
            token, options_token = _strict.set(self._strict), _options.set(self._options)
            try:
                self.failure = report_failure(
                    self._executor, "on its first run", self._operations, error, self._bound_symbols
                )
            finally:
                _options.reset(options_token)
                _strict.reset(token)
            fallback = self._make_fallback()
            self.fn = fallback
            self._rebind(fallback)
            return fallback(*args, **kwargs)
        self._rebind(self.fn)
        return result
