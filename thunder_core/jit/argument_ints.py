"""Ints of argument objects that the guard walk also reaches through the module.

Hugging Face's ``generate`` keeps its cache on the model (``model._cache``) and passes the same
object as ``past_key_values``. The walk of the module guards the cache's ints by value, so an
entry compiled with those ints symbolic would fail its guard on every new value. They are
checked for their type only if no code the capture ran names the attribute through which the
walk reached them: the program then read them as arguments, the cache key holds their values,
and the entry's size guard checks them. If code does name it, the trace may have read the
argument's ints for the module's too (capture saw one object): such ints must stay fixed.
"""

from __future__ import annotations

import re
import types


class ArgumentInts:
    """A ``GuardBuilder``'s record of argument containers met in the walk, and their int checks."""

    def __init__(self):
        self.homes: set[int] = set()  # argument containers whose ints the cache key holds
        self.checks: list[int] = []  # the indexes of the checks of those ints' values
        self._hops: set[str] = set()  # attributes through which the walk reached them
        self._unnamed_hop = False  # reached through a list or dict item instead
        self._inside = 0

    def entering(self, obj, what: str) -> bool:
        """Whether ``obj`` is an argument container met from outside the arguments (then the
        caller walks it between ``entering`` and ``left``)."""
        if id(obj) not in self.homes or self._inside:
            return False
        hop = re.search(r"\.([A-Za-z_]\w*)$", what)
        if hop is None:
            self._unnamed_hop = True
        else:
            self._hops.add(hop.group(1))
        self._inside += 1
        return True

    def left(self) -> None:
        self._inside -= 1

    def may_be_free(self, codes_run: list[tuple[str, types.CodeType]]) -> bool:
        """Whether no code the capture ran can have read them through the module."""
        return not self._unnamed_hop and not any(
            name in code.co_names or name in code.co_consts for _, code in codes_run for name in self._hops
        )

    def read_through_the_module(self, codes_run) -> str | None:
        """The attributes through which the program may have read such ints (None if it cannot)."""
        if not self.checks or self.may_be_free(codes_run):
            return None
        return ", ".join(sorted(self._hops)) or "an item of a list or dict"
