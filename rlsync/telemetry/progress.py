"""The driver's live progress line: step, weight version, and the last step's reward, staleness,
weight-sync stall, total stall and weight bytes moved.

    with StepProgress(total=200) as bar:
        for step in range(200):
            ...
            bar.update(step + 1, version=v, reward=r, stall_s=m["stall/total_s"], staleness=m["staleness/mean"],
                       sync_stall_s=m["stall/rollout_wait_weights_s"], sync_bytes=m["sync/bytes"])

Uses rich. Off when stderr is not a terminal (CI, log files) or when `enabled=False`; then every
call is a no-op, so the driver never checks.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["StepProgress"]


class StepProgress:
    def __init__(self, total: int | None, *, enabled: bool | None = None, description: str = "steps",
                 console: Console | None = None) -> None:
        """`enabled=None`: on when stderr is a terminal. `console`: where to draw (tests pass one)."""
        self.console = console or Console(stderr=True)
        self.enabled = (sys.stderr.isatty() and self.console.is_terminal) if enabled is None else enabled
        self.fields: dict[str, Any] = {"version": "-", "reward": "-", "stale": "-", "sync_stall": "-", "stall": "-",
                                       "sync": "-"}
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("v{task.fields[version]}  reward {task.fields[reward]}  staleness {task.fields[stale]}  "
                       "weight-sync stall {task.fields[sync_stall]}  stall {task.fields[stall]}  "
                       "sync {task.fields[sync]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.enabled,
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total, **self.fields)
        self._started = False

    def __enter__(self) -> "StepProgress":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._progress.start()

    def update(self, step: int, *, version: int | None = None, reward: float | None = None,
               stall_s: float | None = None, staleness: float | None = None, sync_stall_s: float | None = None,
               sync_bytes: float | None = None) -> None:
        """Show `step` steps done, with the latest version and the last step's numbers (None: keep the shown one)."""
        if staleness is not None:
            self.fields["stale"] = f"{staleness:.2f}"
        if sync_stall_s is not None:
            self.fields["sync_stall"] = f"{sync_stall_s:.2f}s"
        if sync_bytes is not None:
            self.fields["sync"] = f"{sync_bytes / 1e6:.1f}MB"
        if version is not None:
            self.fields["version"] = version
        if reward is not None:
            self.fields["reward"] = f"{reward:.3f}"
        if stall_s is not None:
            self.fields["stall"] = f"{stall_s:.2f}s"
        self.start()
        self._progress.update(self._task, completed=step, **self.fields)

    def close(self) -> None:
        if self._started:
            self._progress.stop()
            self._started = False
