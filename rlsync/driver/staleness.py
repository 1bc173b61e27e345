"""The staleness bound, the off-policy cap and the driver's sample buffer. Pure logic: no Ray, no torch, no clock.

Versions and steps share one counter: trainer step s starts from weights version s and publishes
version s + 1. A sample whose oldest token was sampled by version v, trained at step s, is s - v
versions old. Two numbers bound it:
- k (`rollout.max_staleness`): how far ahead generation runs. A request for step t starts from
  version >= t - k (k = 0: synchronous, every request waits for the weights being trained).
- cap (`rollout.max_off_policy_versions`, >= k; None: max(k, 4)): the oldest sample the trainer still
  takes. Anything up to cap versions old is trained (the loss's per-token ratio against the behaviour
  log-probs, and truncated IS on mixed-version samples: trainer/policy_loss.py); older groups are
  dropped and counted.

    bound = StalenessBound(k=1, cap=2)
    bound.min_version(step=5)          # 4: a rollout for step 5 may use version 4 or newer
    buf = SampleBuffer()
    buf.add(version=2, payload="g0", samples=8)
    buf.add(version=3, payload="g1", samples=8)
    took = buf.take(step=5, n=1, bound=bound)   # drops g0 (5 - 2 > 2, counted), returns ["g1"] (3 old: kept)
    took.payloads, took.dropped_samples         # (["g1"], 8)

`plan_request` decides whether the driver may hand a rollout worker one more request now, and for
which step: work is never started for a step more than k versions ahead of the newest version that
exists or is being trained.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["StalenessBound", "SampleBuffer", "Take", "plan_request"]

T = TypeVar("T")


DEFAULT_CAP = 4
"""The off-policy cap when none is given: max(k, DEFAULT_CAP) versions."""


@dataclass(frozen=True, slots=True)
class StalenessBound:
    k: int
    """How far ahead generation runs, in versions: a request for step t starts from version >= t - k."""
    cap: int | None = None
    """Oldest admitted sample, in versions (its oldest token's); older groups are dropped. None: max(k, 4)."""

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.k}")
        if self.cap is None:
            object.__setattr__(self, "cap", max(self.k, DEFAULT_CAP))
        elif self.cap < self.k:
            raise ValueError(f"max_off_policy_versions={self.cap} must be >= max_staleness={self.k}: requests "
                             f"start up to k versions ahead, so samples that old would all be dropped")

    def min_version(self, step: int) -> int:
        """Oldest version a rollout for step `step` may start from."""
        return max(0, step - self.k)

    def staleness(self, version: int, step: int) -> int:
        return step - version

    def admits(self, version: int, step: int) -> bool:
        """Whether step `step` trains a group whose oldest token is from `version` (else it is dropped)."""
        return step - version <= self.cap


@dataclass(slots=True)
class Take(Generic[T]):
    payloads: list[T]
    """The admitted groups handed to the trainer, oldest first (empty when not enough were fresh)."""
    versions: list[int]
    """Generating version of each payload."""
    dropped_groups: int = 0
    """Groups discarded by this take because they were older than the bound allows."""
    dropped_samples: int = 0
    """Samples in those groups."""
    generated_samples: int = 0
    """Samples added to the buffer since the take before this one."""

    def metrics(self, step: int) -> dict[str, float]:
        """Per-step counters to add up over a step's takes: `staleness/dropped`, `staleness/generated`, and
        for the take that feeds step `step`, `staleness/mean` and `staleness/max` of what it took."""
        out = {"staleness/dropped": float(self.dropped_samples), "staleness/generated": float(self.generated_samples)}
        if self.versions:
            age = [step - v for v in self.versions]
            out.update({"staleness/mean": sum(age) / len(age), "staleness/max": float(max(age))})
        return out


@dataclass
class SampleBuffer(Generic[T]):
    """FIFO of scored prompt groups, each tagged with the oldest version that sampled any of its tokens."""

    _items: deque = field(default_factory=deque)
    dropped_groups: int = 0
    """Groups dropped as too stale over the buffer's life."""
    dropped_samples: int = 0
    """Samples dropped as too stale over the buffer's life."""
    generated_samples: int = 0
    """Samples added over the buffer's life."""
    _since_take: int = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, version: int, payload: T, samples: int = 1) -> None:
        """Buffer a group; `version` is the oldest version among its tokens (what the cap reads)."""
        self._items.append((version, payload, samples))
        self.generated_samples += samples
        self._since_take += samples

    def fresh(self, step: int, bound: StalenessBound) -> int:
        """Groups that step `step` may train on."""
        return sum(1 for v, _, _ in self._items if bound.admits(v, step))

    def take(self, step: int, n: int, bound: StalenessBound) -> Take[T]:
        """Drop every group past the cap for `step` (counted), then pop the `n` oldest admitted ones.

        With fewer than `n` fresh groups nothing fresh is taken (the drop still happens: those
        groups can only get staler).
        """
        kept: deque = deque()
        took = Take(payloads=[], versions=[], generated_samples=self._since_take)
        self._since_take = 0
        for v, p, s in self._items:
            if bound.admits(v, step):
                kept.append((v, p, s))
            else:
                took.dropped_groups += 1
                took.dropped_samples += s
        self._items = kept
        self.dropped_groups += took.dropped_groups
        self.dropped_samples += took.dropped_samples
        if len(self._items) >= n:
            for _ in range(n):
                v, p, _ = self._items.popleft()
                took.payloads.append(p)
                took.versions.append(v)
        return took

    def clear(self) -> int:
        """Forget every group (e.g. at resume); returns how many there were."""
        n = len(self._items)
        self._items.clear()
        return n


def plan_request(*, steps_done: int, training: bool, buffered: int, inflight: int, groups_per_step: int,
                 bound: StalenessBound, total_steps: int) -> int | None:
    """Step a new rollout request would feed, or None if it must not start yet.

    `buffered` / `inflight`: fresh groups waiting in the buffer / requested and not yet back.
    The request feeds the first step not yet covered by those groups; it may start only when the
    version it needs (that step - k) exists or is being trained, so no worker runs more than k
    versions ahead, and never for a step past the run's end.

        >>> plan_request(steps_done=3, training=True, buffered=0, inflight=0, groups_per_step=4,
        ...              bound=StalenessBound(0), total_steps=10)
        4
    """
    first_open = steps_done + (1 if training else 0)
    target = first_open + (buffered + inflight) // groups_per_step
    newest = steps_done + (1 if training else 0)  # published, or being made by the step in flight
    if target >= total_steps or bound.min_version(target) > newest:
        return None
    return target
