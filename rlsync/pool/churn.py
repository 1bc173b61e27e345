"""Pool policies as pure logic: a seeded churn schedule for spot pools, and the autoscale rule.

No Ray, no clock: the driver asks what happens at step s and does it (rlsync/pool/policies.py).

    cfg = ChurnConfig(seed=1, preemptions=4, notice_fraction=0.5, joins=2, first_step=5, last_step=40)
    sched = ChurnSchedule.build(cfg, pool="spot", total_steps=50)
    sched.at(12)            # [ChurnEvent(step=12, kind='join', pool='spot')] or [] ...
    len(sched.events)       # 6: 2 preemptions with notice, 2 without, 2 joins, steps in [5, 40]

The same seed gives the same schedule (steps and kinds); which worker a preemption hits is drawn
at run time from the pool's members by `ChurnSchedule.pick_victim`, seeded too.

    autoscale_delta(AutoscaleConfig(), size=2, min_size=1, max_size=4, trainer_wait_data_ratio=0.5,
                    rollout_idle_ratio=0.1)      # +1: the trainer waits on data, grow
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["PREEMPT_NOTICE", "PREEMPT_KILL", "JOIN", "ChurnConfig", "ChurnEvent", "ChurnSchedule",
           "AutoscaleConfig", "autoscale_delta"]

PREEMPT_NOTICE = "preempt_notice"
"""A preemption with notice: the worker finishes its call, then `hub.leave(deadline_s=notice_s)` (retention runs)."""
PREEMPT_KILL = "preempt_kill"
"""A preemption without notice: the Ray actor is killed (`ray.kill`); the hub notices by heartbeat timeout."""
JOIN = "join"
"""A new worker joins the pool mid-run and fetches `latest` (from peers when they hold it) before taking work."""


@dataclass(kw_only=True)
class ChurnConfig:
    """The injected churn of a spot pool (`pools.<name>.policy=spot`)."""

    seed: int = 0
    """Seed of the schedule (event steps and kinds) and of the victim choice."""
    preemptions: int = 0
    """Preemptions injected over the run."""
    notice_fraction: float = field(default=0.5, metadata={"ge": 0, "le": 1})
    """Share of the preemptions that come with notice (rounded); the rest kill the actor without notice."""
    notice_s: float = 10.0
    """Deadline a worker preempted with notice has to leave (`hub.leave(deadline_s=notice_s)`)."""
    joins: int = 0
    """Workers that join the pool mid-run (a join that would take the pool past its max_size is skipped)."""
    first_step: int = 1
    """Earliest step (after which it happens) of an injected event."""
    last_step: int | None = None
    """Latest step of an injected event; None: three quarters of the run."""


@dataclass(frozen=True, slots=True)
class ChurnEvent:
    step: int
    """The event happens right after this trainer step closes."""
    kind: str
    """PREEMPT_NOTICE, PREEMPT_KILL or JOIN."""
    pool: str


@dataclass(slots=True)
class ChurnSchedule:
    events: list[ChurnEvent] = field(default_factory=list)
    """Sorted by step; within a step joins come last (a pool shrinks before it grows)."""
    rng: random.Random = field(default_factory=random.Random)
    """Draws the victims at run time (seeded with the schedule)."""

    @classmethod
    def build(cls, cfg: ChurnConfig, pool: str, total_steps: int) -> "ChurnSchedule":
        if cfg.preemptions < 0 or cfg.joins < 0:
            raise ValueError(f"churn of pool {pool!r}: preemptions and joins must be >= 0")
        if not 0.0 <= cfg.notice_fraction <= 1.0:
            raise ValueError(f"churn of pool {pool!r}: notice_fraction must be in [0, 1], got {cfg.notice_fraction}")
        lo = max(1, cfg.first_step)
        hi = cfg.last_step if cfg.last_step is not None else max(lo, (3 * total_steps) // 4)
        hi = min(hi, max(1, total_steps - 1))  # an event after the last step would never happen
        if (cfg.preemptions or cfg.joins) and hi < lo:
            raise ValueError(f"churn of pool {pool!r}: no step in [first_step={lo}, last_step={hi}] "
                             f"before the run's end ({total_steps} steps)")
        rng = random.Random(f"{cfg.seed}:{pool}")
        n_notice = round(cfg.preemptions * cfg.notice_fraction)
        kinds = [PREEMPT_NOTICE] * n_notice + [PREEMPT_KILL] * (cfg.preemptions - n_notice) + [JOIN] * cfg.joins
        rng.shuffle(kinds)
        steps = sorted(rng.randint(lo, hi) for _ in kinds)
        order = {PREEMPT_NOTICE: 0, PREEMPT_KILL: 0, JOIN: 1}
        events = sorted((ChurnEvent(s, k, pool) for s, k in zip(steps, kinds)), key=lambda e: (e.step, order[e.kind]))
        return cls(events=events, rng=rng)

    def at(self, step: int) -> list[ChurnEvent]:
        return [e for e in self.events if e.step == step]

    def pick_victim(self, candidates: list[str]) -> str | None:
        """A seeded choice among the worker keys a preemption may hit (sorted first: order-independent)."""
        return self.rng.choice(sorted(candidates)) if candidates else None


@dataclass(kw_only=True)
class AutoscaleConfig:
    """Thresholds of an autoscaled pool (`pools.<name>.policy=autoscale`; bounds: `min_size`, `max_size`)."""

    grow_above_wait_ratio: float = 0.3
    """Grow by one when the trainer spent more than this share of a step waiting for data."""
    shrink_above_idle_ratio: float = 0.7
    """Shrink by one when the pool's workers were idle more than this share of a step."""
    cooldown_steps: int = 5
    """Steps between two resizes (a new worker needs a few steps to start and fetch)."""


def autoscale_delta(cfg: AutoscaleConfig, *, size: int, min_size: int, max_size: int,
                    trainer_wait_data_ratio: float | None, rollout_idle_ratio: float | None) -> int:
    """+1, -1 or 0: the resize one step's stall numbers ask for, within [min_size, max_size].

        >>> autoscale_delta(AutoscaleConfig(), size=2, min_size=1, max_size=2, trainer_wait_data_ratio=0.9,
        ...                 rollout_idle_ratio=0.0)
        0
    """
    if size < min_size:
        return 1
    if size > max_size:
        return -1
    if trainer_wait_data_ratio is not None and trainer_wait_data_ratio > cfg.grow_above_wait_ratio:
        return 1 if size < max_size else 0
    if rollout_idle_ratio is not None and rollout_idle_ratio > cfg.shrink_above_idle_ratio:
        return -1 if size > min_size else 0
    return 0
