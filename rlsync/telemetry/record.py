"""The run's record in RUN_DIR, opened for a fresh run or continued by a resumed one: metrics.jsonl,
trace.json and parts.json (one entry per process that ran the run).

    record = RunRecord(run_dir, cfg.logging, run_config, resumed_from_step=None)  # fresh: parts.json starts over
    record.logger.log(metrics, step=7); record.trace.add(records)
    record.close(last_step=40)                   # this part's last step and wall time into parts.json
    RunRecord(run_dir, cfg.logging, run_config, resumed_from_step=40)             # `resume=auto` later

A resumed run (from the checkpoint of step N) keeps metrics rows through step N and logs only later steps
(those after N that the part before logged are dropped, being trained again: each step is there once); it
appends to the trace (never overwrites it; trace.py); and adds a part to parts.json:

    read_parts(run_dir)   # [{"part": 1, "resumed_from_step": None, "first_step": 1, "last_step": 40, "wall_s": 95.0,
                          #   "started_unix": ...}, {"part": 2, "resumed_from_step": 40, "first_step": 41, ...}]

The end-of-run summary (summary.py) reads the parts to say which were resumed and what each took: the
metrics cover the whole run, a process's own clock only its part. A part without `wall_s` died before its
end (SIGKILL, a crash). parts.json is rewritten atomically at each open and close.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

from rlsync.telemetry.loggers import LoggingConfig, make_logger
from rlsync.telemetry.trace import TraceWriter

__all__ = ["PARTS_FILE", "RunRecord", "read_parts"]

PARTS_FILE = "parts.json"


def read_parts(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    try:
        return json.loads((Path(run_dir) / PARTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []


def _write_parts(run_dir: Path, parts: list[dict[str, Any]]) -> None:
    tmp = run_dir / (PARTS_FILE + ".tmp")
    tmp.write_text(json.dumps(parts, indent=1), encoding="utf-8")
    os.replace(tmp, run_dir / PARTS_FILE)


class RunRecord:
    def __init__(self, run_dir: str | os.PathLike, logging: LoggingConfig, run_config: Mapping[str, Any] | None,
                 *, resumed_from_step: int | None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logger = make_logger(dataclasses.replace(logging, run_dir=str(self.run_dir)), run_config=run_config,
                                  resume_step=resumed_from_step)
        self.trace = TraceWriter(self.run_dir / "trace.json", resumed_from_step=resumed_from_step)
        parts = read_parts(self.run_dir) if resumed_from_step is not None else []
        start = resumed_from_step or 0
        parts.append({"part": len(parts) + 1, "resumed_from_step": resumed_from_step, "first_step": start + 1,
                      "last_step": start, "wall_s": None, "started_unix": time.time()})
        _write_parts(self.run_dir, parts)
        self._index, self._t0 = len(parts) - 1, time.monotonic()

    def close(self, last_step: int) -> None:
        """Close the trace and the loggers; record this part's last finished step and wall time."""
        parts = read_parts(self.run_dir)
        if self._index < len(parts):
            parts[self._index].update(last_step=int(last_step), wall_s=round(time.monotonic() - self._t0, 3))
            _write_parts(self.run_dir, parts)
        self.trace.close()
        self.logger.close()
