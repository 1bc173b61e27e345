"""`Registry`: the one name → class (or function) table for the things people add.

Losses, advantage estimators, trainer backends, rollout engines, model loaders, tasks, rewards,
pool policies and bench scenarios are each a `Registry` declared beside their base class. Adding one
is one new file that decorates its class; nothing else is edited:

    @register_adv_est("rloo")
    class RLOOAdvantage(AdvantageEstimator): ...

    get_adv_est("rloo")            # -> RLOOAdvantage
    get_adv_est("nope")            # UnknownNameError: unknown advantage estimator 'nope'; known: gae, grpo, rloo

Simplifies: no plugin entry points; a registry is filled when its module is imported (each
package's `__init__` imports its built-ins). The hub keeps its own small transport registry: it
imports nothing of the RL side.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """A registry was asked for a name nobody registered. Carries the known names."""

    def __init__(self, kind: str, name: str, known: list[str], where: str = ""):
        self.kind, self.name, self.known = kind, name, known
        at = f"{where}: " if where else ""
        super().__init__(f"{at}unknown {kind} {name!r}; known: {', '.join(known) or '(none)'}")

    def __str__(self) -> str:  # KeyError's str() adds quotes around the message
        return self.args[0]


class DuplicateNameError(ValueError):
    """Two different objects were registered under one name."""


class Registry(Generic[T]):
    """A named table of classes (or functions) of one kind.

    >>> r = Registry("widget"); r.register("a")(int); r.get("a")
    <class 'int'>
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._table: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            old = self._table.get(name)
            # Re-registering the same definition (a module imported twice) is harmless.
            if old is not None and _ident(old) != _ident(obj):
                raise DuplicateNameError(f"{self.kind} {name!r} is already registered to {old!r}")
            self._table[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._table[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        return sorted(self._table)

    def __contains__(self, name: str) -> bool:
        return name in self._table

    def check(self, name: str, where: str) -> None:
        """Raise `UnknownNameError` naming the config key `where` when `name` is not registered."""
        if name not in self._table:
            raise UnknownNameError(self.kind, name, self.names(), where=where)


def _ident(obj: object) -> tuple[str, str]:
    return getattr(obj, "__module__", ""), getattr(obj, "__qualname__", repr(obj))
