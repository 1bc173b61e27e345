"""Chrome trace of every worker's states: `RUN_DIR/trace.json`, opened by Perfetto or chrome://tracing.

Layout (Chrome "JSON Object Format"): one process per role/pool ("rollout/spot", "trainer"), one
thread (track) per worker, a complete slice ("ph": "X") per state interval, an instant ("ph": "i")
per event (publish, fetch, ...) with its attrs as args, an instant `mixed_version_sample` per sample
whose tokens came from more than one weight version (its version spans), and the driver's steps as
slices on a "driver" track. `ts`/`dur` are microseconds since the trace's `t0_ns` (kept in `otherData`).

The file is streamed: events are appended as records arrive and flushed per `flush()`, so a
crashed run still leaves a trace; `load_trace()` reads one that lacks its closing brackets.
Adjacent intervals of one worker in the same state (a `drain()` cut) are merged into one slice.

A resumed run appends (`TraceWriter(path, resumed_from_step=N)`), never overwrites: it takes off only the
closing brackets (or, after a crash, a torn last event), keeps the file's `t0_ns` (the clocks share
a wall-clock base, so the parts sit on one timeline with the downtime as a gap) and its tracks (a
worker or pool seen before keeps its track), and marks the seam with a "resumed from step N"
instant on the driver track.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from rlsync.core.stall import Event, Interval, Record, now_ns

__all__ = ["TraceWriter", "load_trace", "STATE_COLORS"]

STATE_COLORS = {
    # Chrome trace reserved colour names ("cname"), so a state looks the same in every trace.
    "generating": "good",
    "training": "thread_state_running",
    "waiting_weights": "terrible",
    "loading_weights": "bad",
    "waiting_data": "thread_state_iowait",
    "releasing": "thread_state_uninterruptible",
    "offloading": "yellow",
    "idle": "grey",
}


class TraceWriter:
    """Append stall records to a Chrome trace file.

        with TraceWriter(run_dir / "trace.json") as tw:
            tw.add(records)                     # Interval/Event from StallClock.drain()
            tw.step(7, start_ns, end_ns, version=7)
    """

    DRIVER_PID = 0
    _CLOSE = "\n]}\n"

    def __init__(self, path: str | os.PathLike, t0_ns: int | None = None, *,
                 resumed_from_step: int | None = None) -> None:
        """`resumed_from_step`: a resumed run; it continues the trace at `path` (if there is one) from a mark."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pids: dict[str, int] = {}
        self._tids: dict[str, tuple[int, int]] = {}
        self._pending: dict[str, Interval] = {}  # last interval per worker, held back for merging
        if resumed_from_step is not None and self.path.exists() and self._reopen():
            self._write({"ph": "i", "s": "g", "name": f"resumed from step {resumed_from_step}", "cat": "resume",
                         "pid": self.DRIVER_PID, "tid": 0, "ts": self._us(now_ns()),
                         "args": {"resumed_from_step": resumed_from_step}})
            return
        self.t0_ns = now_ns() if t0_ns is None else t0_ns
        self._f = open(self.path, "w", encoding="utf-8")
        self._first = True
        self._f.write('{"displayTimeUnit": "ms", "otherData": ')
        json.dump({"t0_ns": self.t0_ns, "producer": "rlsync"}, self._f)
        self._f.write(', "traceEvents": [\n')
        self._meta(self.DRIVER_PID, 0, "process_name", "driver")
        self._meta(self.DRIVER_PID, 0, "thread_name", "steps")

    def _reopen(self) -> bool:
        """Continue the existing file: cut its closing brackets (or a torn tail), take its t0 and tracks."""
        text = self.path.read_text(encoding="utf-8")
        if text.endswith(self._CLOSE):
            keep = len(text) - len(self._CLOSE)
        else:  # a crashed writer: keep whole events (one per line after the header, ending in "," but the last)
            keep, end = 0, len(text)
            while end > 0:
                start = text.rfind("\n", 0, end) + 1
                line = text[start:end].rstrip().rstrip(",")
                if line.endswith('"traceEvents": ['):  # the header: no whole event after it
                    keep = start + len(line)
                    break
                try:
                    json.loads(line)
                    keep = start + len(line)
                    break
                except json.JSONDecodeError:
                    end = start - 1
        try:
            trace = json.loads(text[:keep] + self._CLOSE)
        except json.JSONDecodeError:  # not a trace of ours: set it aside (never overwritten), start a new file
            self.path.rename(self.path.with_name(self.path.name + ".unreadable"))
            return False
        self.t0_ns = int(trace["otherData"]["t0_ns"])
        for e in trace["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "process_name" and e["pid"] != self.DRIVER_PID:
                self._pids[e["args"]["name"]] = e["pid"]
            elif e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] != self.DRIVER_PID:
                self._tids[e["args"]["name"]] = (e["pid"], e["tid"])
        with open(self.path, "r+", encoding="utf-8") as f:
            f.truncate(len(text[:keep].encode("utf-8")))
        self._f = open(self.path, "a", encoding="utf-8")
        self._first = not any(e for e in trace["traceEvents"])
        return True

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _us(self, t_ns: int) -> float:
        return (t_ns - self.t0_ns) / 1e3

    def _write(self, ev: dict[str, Any]) -> None:
        if not self._first:
            self._f.write(",\n")
        self._first = False
        json.dump(ev, self._f, default=str)

    def _meta(self, pid: int, tid: int, kind: str, name: str) -> None:
        self._write({"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}})

    def _track(self, worker_id: str, role: str, pool: str | None) -> tuple[int, int]:
        if worker_id not in self._tids:
            group = f"{role}/{pool}" if pool else role
            if group not in self._pids:
                pid = self._pids[group] = len(self._pids) + 1
                self._meta(pid, 0, "process_name", group)
                self._write({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
                             "args": {"sort_index": pid}})
            pid = self._pids[group]
            tid = len(self._tids) + 1
            self._tids[worker_id] = (pid, tid)
            self._meta(pid, tid, "thread_name", worker_id)
        return self._tids[worker_id]

    def _slice(self, iv: Interval) -> None:
        pid, tid = self._track(iv.worker_id, iv.role, iv.pool)
        self._write({
            "ph": "X", "name": iv.state, "cat": "state", "pid": pid, "tid": tid,
            "ts": self._us(iv.start_ns), "dur": (iv.end_ns - iv.start_ns) / 1e3,
            "cname": STATE_COLORS.get(iv.state, "generic_work"),
        })

    def add(self, records: Iterable[Record]) -> None:
        for r in records:
            if isinstance(r, Interval):
                prev = self._pending.get(r.worker_id)
                if prev is not None and prev.state == r.state and prev.end_ns == r.start_ns:
                    self._pending[r.worker_id] = prev._replace(end_ns=r.end_ns)
                    continue
                if prev is not None:
                    self._slice(prev)
                self._pending[r.worker_id] = r
            elif isinstance(r, Event):
                pid, tid = self._track(r.worker_id, r.role, r.pool)
                self._write({"ph": "i", "s": "t", "name": r.name, "cat": "event", "pid": pid,
                             "tid": tid, "ts": self._us(r.ts_ns), "args": dict(r.attrs)})

    def mixed_samples(self, worker_id: str, pool: str | None, batch: Any) -> int:
        """An instant `mixed_version_sample` on the rollout worker's track for every sample of `batch` (a
        `Batch`) whose response spans a weight switch, with its spans [[version, first, last], ...] (response
        token indices, last inclusive) and its prompt group. Returns how many were written."""
        rows = (batch.span_counts() > 1).nonzero().flatten().tolist()
        if rows:
            pid, tid = self._track(worker_id, "rollout", pool)
            ts = self._us(now_ns())
        for i in rows:
            group = int(batch.group_ids[i]) if batch.group_ids is not None else None
            self._write({"ph": "i", "s": "t", "name": "mixed_version_sample", "cat": "event", "pid": pid, "tid": tid,
                         "ts": ts, "args": {"group": group, "version": int(batch.versions[i]),
                                            "spans": [list(s) for s in batch.spans(i)]}})
        return len(rows)

    def step(self, step: int, start_ns: int, end_ns: int, **args: Any) -> None:
        """The driver's step `step` as a slice on the driver track (args: version, reward, ...)."""
        self._write({"ph": "X", "name": f"step {step}", "cat": "step", "pid": self.DRIVER_PID,
                     "tid": 0, "ts": self._us(start_ns), "dur": (end_ns - start_ns) / 1e3,
                     "args": {"step": step, **args}})

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if self._f.closed:
            return
        for iv in self._pending.values():
            self._slice(iv)
        self._pending.clear()
        self._f.write("\n]}\n")
        self._f.close()


def load_trace(path: str | os.PathLike) -> dict[str, Any]:
    """Read a trace written by `TraceWriter`, also one cut short by a crash (no closing brackets)."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # A crashed writer leaves the events array open, possibly mid-event: keep whole lines.
        lines = text.rstrip().splitlines()
        while lines:
            try:
                return json.loads("\n".join(lines).rstrip().rstrip(",") + "\n]}")
            except json.JSONDecodeError:
                lines.pop()
        raise
