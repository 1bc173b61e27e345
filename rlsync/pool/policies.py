"""Pool policies (`pools.<name>.policy`): what a pool does after each trainer step. A registry.

    fixed      its `size` workers run the whole job
    spot       a seeded `ChurnSchedule` (churn.py) preempts workers (with and without notice) and adds new ones
    autoscale  one worker more or less per cooldown, from the step's stall numbers (churn.autoscale_delta)

Adding a policy is one new file:

    @register_pool_policy("drain_at_night")
    class DrainAtNight(PoolPolicy):
        def on_step(self, pools, pool, step, metrics): ...   # pools: the PoolSet (add / leave / kill members)

A policy gets the `PoolSet` to act through (`add_member`, `leave_member`, `kill_member`, `count`),
so it never touches Ray itself. `PoolConfig` (one `pools.<name>` entry of the run's config) lives here too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rlsync.core.registry import Registry
from rlsync.pool.churn import (JOIN, PREEMPT_KILL, PREEMPT_NOTICE, AutoscaleConfig, ChurnConfig, ChurnSchedule,
                                autoscale_delta)
from rlsync.rollout.engine import RolloutEngine
from rlsync.workers.process import LocationConfig

log = logging.getLogger(__name__)

ENGINE_BOUNDS: dict[str, dict[str, Any]] = {
    "temperature": {"gt": 0}, "top_p": {"gt": 0, "le": 1}, "top_k": {"ge": 0}, "max_new_tokens": {"ge": 0}}
"""Bounds of the engine's own `RolloutEngine.Config` fields, as the run checks them (rlsync/config/rules.py)."""


@dataclass(kw_only=True)
class PoolConfig:
    size: int = field(default=1, metadata={"ge": 0})
    """Rollout worker actors this pool starts with."""
    policy: str = "fixed"
    """`fixed` (size workers all run long), `autoscale` (between min_size and max_size, by stall), or
    `spot` (the churn schedule preempts and adds workers)."""
    min_size: int = field(default=1, metadata={"ge": 0})
    """autoscale: fewest workers; spot: a preemption never takes the pool below it."""
    max_size: int = field(default=0, metadata={"ge": 0})
    """autoscale / spot: most workers (0: size)."""
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    """policy=spot: seeded preemptions (with and without notice) and joins."""
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    """policy=autoscale: when to grow and shrink."""
    location: LocationConfig = field(default_factory=LocationConfig)
    """Where this pool's workers are (hub topology labels)."""
    engine: RolloutEngine.Config = field(default_factory=lambda: RolloutEngine.Config(max_new_tokens=0),
                                         metadata={"bounds": ENGINE_BOUNDS})
    """Sampling: temperature (must equal trainer.algo.temperature), top_p, top_k, max_new_tokens
    (0: the task's answer length, or 16 for tasks without one)."""


POOL_POLICIES: Registry = Registry("pool policy")
register_pool_policy = POOL_POLICIES.register


class PoolPolicy:
    """Base: a fixed pool (no resizing). `cfg` is the pool's `PoolConfig`."""

    def __init__(self, name: str, cfg: Any, total_steps: int):
        self.name, self.cfg = name, cfg

    @classmethod
    def validate(cls, name: str, cfg: Any) -> None:
        """Refuse a pool config this policy cannot run (called before anything starts)."""
        if cfg.churn.preemptions or cfg.churn.joins:
            raise ValueError(f"pools.{name}.churn is set but policy={cfg.policy!r}: churn needs policy=spot")

    def on_step(self, pools: Any, pool: Any, step: int, metrics: dict[str, float]) -> None:
        """After trainer step `step` closed with `metrics`: resize `pool` through `pools` (a PoolSet)."""


@register_pool_policy("fixed")
class FixedPolicy(PoolPolicy):
    """`size` workers all run long; `pools.<name>.size: 0` switches a default pool off."""


@register_pool_policy("spot")
class SpotPolicy(PoolPolicy):
    """The churn schedule's preemptions and joins, after the steps it drew (seeded)."""

    def __init__(self, name: str, cfg: Any, total_steps: int):
        super().__init__(name, cfg, total_steps)
        self.schedule = ChurnSchedule.build(cfg.churn, name, total_steps)
        self.deferred: list[str] = []
        """Preemptions that could not happen yet (the pool at min_size, or no ready worker): retried each step."""

    @classmethod
    def validate(cls, name: str, cfg: Any) -> None:
        pass

    def on_step(self, pools: Any, pool: Any, step: int, metrics: dict[str, float]) -> None:
        kinds, self.deferred = [*self.deferred, *(ev.kind for ev in self.schedule.at(step))], []
        for kind in kinds:
            self._churn(pools, pool, kind)

    def _churn(self, pools: Any, p: Any, kind: str) -> None:
        if kind == JOIN:
            if len(p.live()) >= p.max_size:
                pools.count("events/joins_skipped")
                return
            key = pools.add_member(p)
            pools.count("events/joins")
            log.info("churn: %s joins pool %s", key, p.name)
            return
        ready = p.ready()
        if len(p.live()) - 1 < p.cfg.min_size or pools.ready_count() - 1 < 1 or not ready:
            self.deferred.append(kind)  # it would leave the pool (or the run) without a worker: later
            return
        victim = self.schedule.pick_victim(ready)
        pools.count("events/preemptions")
        if kind == PREEMPT_KILL:
            log.info("churn: %s preempted without notice (killed)", victim)
            pools.count("events/preemptions_kill")
            pools.kill_member(p.name, victim)
        elif kind == PREEMPT_NOTICE:
            log.info("churn: %s preempted with %.0fs notice", victim, p.cfg.churn.notice_s)
            pools.count("events/preemptions_notice")
            pools.leave_member(p, victim, p.cfg.churn.notice_s)


@register_pool_policy("autoscale")
class AutoscalePolicy(PoolPolicy):
    """Grow when the trainer waits on data, shrink when the pool idles (within min_size..max_size)."""

    def __init__(self, name: str, cfg: Any, total_steps: int):
        super().__init__(name, cfg, total_steps)
        self.last_resize = -(10**9)

    def on_step(self, pools: Any, pool: Any, step: int, metrics: dict[str, float]) -> None:
        if step - self.last_resize < self.cfg.autoscale.cooldown_steps:
            return
        window = metrics.get("stall/window_s", 0.0)
        ranks = metrics.get("pool/trainer/workers", 1.0) or 1.0
        wait = metrics.get("stall/trainer_wait_data_s", 0.0) / (window * ranks) if window > 0 else None
        d = autoscale_delta(self.cfg.autoscale, size=len(pool.live()), min_size=self.cfg.min_size,
                            max_size=pool.max_size, trainer_wait_data_ratio=wait,
                            rollout_idle_ratio=metrics.get(f"pool/{self.name}/idle_ratio"))
        if d > 0:
            pools.add_member(pool)
            pools.count("events/joins")
        elif d < 0:
            pools.leave_member(pool, sorted(pool.live())[-1], notice_s=self.cfg.churn.notice_s)
            pools.count("events/shrinks")
        if d:
            self.last_resize = step
