"""Checkpoints of a run: the trainer's state (its backend's format) plus the driver's state, per step.

    store = CheckpointStore("RUN_DIR/checkpoints", keep=2)
    path = store.begin(step=40)                 # trainer ranks save their backend state here first
    store.commit(40, {"step": 40, "version": 40, "task": {"cursor": 1280, "seed": 0}})
    store.latest()                              # (path, driver_state) of the newest committed one

A checkpoint counts only once `driver_state.json` is in it: the driver writes that file last and
atomically (write + rename), so a crash mid-save leaves the previous checkpoint as the newest.

Written on cadence (`checkpoint.every`), at the end, and at Ctrl-C (`Driver.stop`: at the step boundary,
after the step in flight), so `resume=auto` after Ctrl-C loses no finished step.

Driver state: `step` (= the weight version: step s publishes version s + 1, so after s steps the
version is s), the task's data cursor (the next prompt to hand out), and run totals (dropped
samples). Rollouts in flight at save time are not saved: on resume their prompts are skipped (the
cursor is past them), and they were never trained on.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["CheckpointStore", "DRIVER_STATE"]

DRIVER_STATE = "driver_state.json"


class CheckpointStore:
    def __init__(self, root: str | os.PathLike, keep: int = 2):
        self.root = Path(root)
        self.keep = max(1, keep)

    def path_for(self, step: int) -> Path:
        return self.root / f"step_{step:07d}"

    def begin(self, step: int) -> Path:
        """The (created) directory the trainer ranks save `step`'s files into, before `commit`."""
        path = self.path_for(step)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def commit(self, step: int, driver_state: dict[str, Any]) -> Path:
        """Mark the checkpoint of `step` complete (its trainer files must be written), prune old ones."""
        path = self.path_for(step)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / (DRIVER_STATE + ".tmp")
        tmp.write_text(json.dumps(driver_state, indent=1))
        os.replace(tmp, path / DRIVER_STATE)
        for old in self.committed()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def committed(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("step_*") if (p / DRIVER_STATE).is_file())

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        done = self.committed()
        if not done:
            return None
        return done[-1], load_driver_state(done[-1])

    def latest_step(self) -> int:
        """The newest committed checkpoint's step; 0 when there is none."""
        newest = self.latest()
        return int(newest[1]["step"]) if newest is not None else 0

    def resolve(self, resume: str) -> tuple[Path, dict[str, Any]] | None:
        """`never` -> None; `auto` -> the newest committed checkpoint or None; else that directory."""
        if resume in ("never", "", None):
            return None
        if resume == "auto":
            return self.latest()
        path = Path(resume)
        if not (path / DRIVER_STATE).is_file():
            raise FileNotFoundError(f"resume={resume!r}: no {DRIVER_STATE} there (not a committed checkpoint)")
        return path, load_driver_state(path)


def load_driver_state(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(path) / DRIVER_STATE).read_text())
