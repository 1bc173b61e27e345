"""rlsync: RL training for LLMs (GRPO, PPO) with a Reference-Oriented Storage hub for weight sync.

The public API (imported lazily, so `import rlsync.hub` stays free of torch and Ray):

    from rlsync import Driver, TrainConfig, run
    summary = run(TrainConfig(steps=20), run_dir="runs/r1")     # = Driver(cfg, run_dir).run()

Rooms (docs/architecture.md): `rlsync.core` (low: Batch, Registry, stall clock, events),
`rlsync.hub` (ROS), `rlsync.trainer`, `rlsync.rollout`, and the driver's sub-packages `driver/`,
`workers/`, `pools/`, `telemetry/`, `bench/`. Entry points: `python -m rlsync.train`,
`python -m rlsync.pools`, `python -m rlsync.report`, `python -m rlsync.bench`, `python -m rlsync.hub`.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["Driver", "RunError", "TrainConfig", "run"]


def run(cfg: Any, run_dir: str | os.PathLike) -> dict[str, float]:
    """Run the RL loop of `cfg` (a `TrainConfig`) with its outputs in `run_dir`; returns the run's totals."""
    from rlsync.driver import Driver

    return Driver(cfg, run_dir).run()


def __getattr__(name: str) -> Any:
    if name in ("Driver", "RunError"):
        from rlsync import driver

        return getattr(driver, name)
    if name == "TrainConfig":
        from rlsync.config.schema import TrainConfig

        return TrainConfig
    raise AttributeError(name)
