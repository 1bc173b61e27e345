"""Model-parallel shard coordinates.

A model with no model parallelism has one shard, `Shard()`. A TP=2 model has `Shard(tp=0, tp_size=2)`
and `Shard(tp=1, tp_size=2)`; a version commits only when every shard of its group is published.

    >>> Shard(tp=1, tp_size=2).key, Shard().group
    ('tp1-pp0', (1, 1))
"""
from __future__ import annotations

from dataclasses import dataclass

from rlsync.hub.errors import ShardError


@dataclass(frozen=True, slots=True)
class Shard:
    tp: int = 0
    """Tensor-parallel rank of this shard."""
    pp: int = 0
    """Pipeline-parallel stage of this shard."""
    tp_size: int = 1
    """Tensor-parallel degree of the group."""
    pp_size: int = 1
    """Pipeline-parallel degree of the group."""

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "tp_size", "pp_size"):
            if not isinstance(getattr(self, name), int):
                raise ShardError(f"Shard.{name} must be an int")
        if self.tp_size < 1 or self.pp_size < 1:
            raise ShardError(f"group sizes must be >= 1, got tp_size={self.tp_size} pp_size={self.pp_size}")
        if not (0 <= self.tp < self.tp_size and 0 <= self.pp < self.pp_size):
            raise ShardError(f"shard tp={self.tp} pp={self.pp} is outside its group "
                             f"tp_size={self.tp_size} pp_size={self.pp_size}")

    @property
    def key(self) -> str:
        return f"tp{self.tp}-pp{self.pp}"

    @property
    def group(self) -> tuple[int, int]:
        return (self.tp_size, self.pp_size)

    @property
    def group_count(self) -> int:
        return self.tp_size * self.pp_size

    def to_wire(self) -> list[int]:
        return [self.tp, self.pp, self.tp_size, self.pp_size]

    @classmethod
    def from_wire(cls, w) -> "Shard":
        try:
            tp, pp, tps, pps = (int(x) for x in w)
        except (TypeError, ValueError):
            raise ShardError(f"malformed shard {w!r}") from None
        return cls(tp, pp, tps, pps)
