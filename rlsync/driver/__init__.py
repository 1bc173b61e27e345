"""rlsync.driver: the RL loop that owns a run — `Driver` (loop.py), the staleness bound
(staleness.py), checkpoints (checkpoint.py), the no-weights-through-Ray audit (audit.py).

    from rlsync.driver import Driver
    Driver(TrainConfig(steps=20), run_dir="runs/r1").run()
"""

from __future__ import annotations

from typing import Any

__all__ = ["Driver", "RunError"]


def __getattr__(name: str) -> Any:
    # Lazy: `rlsync.driver.staleness` (pure logic) must not pull in Ray and torch.
    if name in __all__:
        from . import loop

        return getattr(loop, name)
    raise AttributeError(name)
