"""Per-step stall, sync and hub metrics, from the stall records of one step window. Pure logic.

Definitions (docs/telemetry.md repeats them with the commands that show them). For a step window
W = [start, end) and every worker's intervals clipped to W:

- side: a worker's role, `rollout` or `trainer`. Workers of other roles appear only in `per_worker`.
- `stall/{side}_{cause}_s` = Σ over the side's workers of seconds in the cause's state, in
  worker-seconds (4 rollout workers each waiting 0.5 s give 2.0). Causes and their states:
  wait_weights=waiting_weights, load_weights=loading_weights, wait_data=waiting_data,
  wait_release=releasing, offload=offloading, idle=idle. All twelve keys are always present.
  The issue's keys are among them: `stall/rollout_wait_weights_s`, `stall/trainer_wait_data_s`,
  `stall/trainer_wait_release_s`.
- `stall/total_s` = Σ of the twelve cause keys = every non-productive worker-second of both sides.
- `stall/{side}_idle_ratio` = non-productive / observed worker-seconds of the side in W, where
  productive = generating or training and observed = time covered by intervals (a worker that lived
  through W observes |W|; one that joined halfway observes half). Absent when the side observed
  nothing. A rollout pool idle while the trainer trains reads ≈ 1, not 0 (cf. verl#6693).
- `sync/bytes` = Σ `bytes` of `fetch` events whose timestamp is in W; `sync/seconds` = length of the
  union of those fetches' spans [ts - seconds, ts] (wall time with a fetch in flight); `sync/gbps`
  = sync/bytes / sync/seconds / 1e9, in GB/s (gigaBYTES, aggregate over concurrent fetches), 0
  when nothing was fetched. `sync/fetches` counts them.
- `hub/replicas`, `hub/retained_versions`: the hub's own numbers at the step end (`HubStats`).
- `hub/plan_ms` (p50 and `hub/plan_ms_p99` of the hub's recent fetch plans), `hub/rpc_per_s` (control
  RPCs it answered per second, last ~10 s), `hub/heartbeat_lag_ms` (p99 over live workers of the time
  since the hub last heard from each): the hub's own latency, when the hub reports it.
- `pool/{pool}/workers`: workers with observed time in W per pool (pool = the clock's pool, or
  its role when it has none); `pool/{pool}/idle_ratio` as above, per pool.
- `stall/window_s` = |W|.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from rlsync.core.stall import PRODUCTIVE_STATES, Event, Interval, Record, State, now_ns, summarize

__all__ = [
    "SIDES",
    "CAUSES",
    "STALL_CAUSE_KEYS",
    "SyncStats",
    "HubStats",
    "StepMetrics",
    "StepAggregator",
]

SIDES = ("rollout", "trainer")

CAUSES: dict[str, str] = {
    State.WAITING_WEIGHTS.value: "wait_weights",
    State.LOADING_WEIGHTS.value: "load_weights",
    State.WAITING_DATA.value: "wait_data",
    State.RELEASING.value: "wait_release",
    State.OFFLOADING.value: "offload",
    State.IDLE.value: "idle",
}
"""Non-productive state -> cause name used in the metric keys."""

STALL_CAUSE_KEYS: tuple[str, ...] = tuple(
    f"stall/{side}_{cause}_s" for side in SIDES for cause in CAUSES.values()
)
"""The keys that stack to `stall/total_s`, in dashboard order."""


@dataclass(frozen=True, slots=True)
class SyncStats:
    """Weight bytes moved in a window and the wall seconds during which a transfer was in flight."""

    bytes: int = 0
    seconds: float = 0.0
    fetches: int = 0

    @property
    def gbps(self) -> float:
        """GB/s (1e9 bytes per second); 0 when nothing moved."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @classmethod
    def from_events(
        cls, records: Iterable[Record], window_start_ns: int, window_end_ns: int, name: str = "fetch"
    ) -> "SyncStats":
        """From `name` events (attrs `bytes`, `seconds`) timestamped inside the window."""
        spans: list[tuple[int, int]] = []
        total = 0
        for r in records:
            if isinstance(r, Event) and r.name == name and window_start_ns <= r.ts_ns < window_end_ns:
                total += int(r.attrs.get("bytes", 0))
                dur = int(float(r.attrs.get("seconds", 0.0)) * 1e9)
                spans.append((r.ts_ns - dur, r.ts_ns))
        return cls(bytes=total, seconds=_union_ns(spans) / 1e9, fetches=len(spans))


def _union_ns(spans: list[tuple[int, int]]) -> int:
    covered, cur_lo, cur_hi = 0, None, None
    for lo, hi in sorted(spans):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                covered += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        covered += cur_hi - cur_lo
    return covered


@dataclass(frozen=True, slots=True)
class HubStats:
    """The hub's view at a step end."""

    replicas: int
    """Replicas (worker, version, shard) the hub routes reads to."""
    retained_versions: int
    """Versions kept retrievable (latest committed + pinned)."""
    plan_ms: float | None = None
    """Median time the hub took to answer its recent fetch plans (state, planner, tickets, encoding)."""
    plan_ms_p99: float | None = None
    rpc_per_s: float | None = None
    """Control RPCs the hub answered per second, over its last ~10 s."""
    heartbeat_lag_ms: float | None = None
    """p99 over live workers of the time since the hub last heard from each: near the heartbeat period
    when the hub keeps up, growing toward the worker timeout (expiry) when heartbeats queue."""


@dataclass(slots=True)
class StepMetrics:
    """One step window's metrics; `to_dict()` gives the logged keys (see module docstring)."""

    window_s: float
    per_worker: dict[str, dict[str, float]]
    """worker_id -> seconds per state inside the window."""
    worker_info: dict[str, tuple[str, str | None]]
    """worker_id -> (role, pool)."""
    sync: SyncStats = field(default_factory=SyncStats)
    hub: HubStats | None = None
    engine_updates: dict[str, float] = field(default_factory=dict)
    """Σ fetch_s / apply_s / pause_s / fetch_wait_s (and decode_pause_s, stage_raised when in flight) of
    `engine_update` events in the window (engines that stage and apply, e.g. vLLM); empty when there were none."""

    @classmethod
    def compute(
        cls,
        records: Iterable[Record],
        window_start_ns: int,
        window_end_ns: int,
        *,
        sync: SyncStats | None = None,
        hub: HubStats | None = None,
    ) -> "StepMetrics":
        """Aggregate every worker's records over the window. `sync` defaults to the fetch events."""
        records = list(records)
        by_worker: dict[str, list[Record]] = {}
        info: dict[str, tuple[str, str | None]] = {}
        for r in records:
            by_worker.setdefault(r.worker_id, []).append(r)
            info.setdefault(r.worker_id, (r.role, r.pool))
        per_worker = {w: summarize(rs, window_start_ns, window_end_ns) for w, rs in by_worker.items()}
        if sync is None:
            sync = SyncStats.from_events(records, window_start_ns, window_end_ns)
        updates: dict[str, float] = {}
        for r in records:
            if isinstance(r, Event) and r.name == "engine_update" and window_start_ns <= r.ts_ns < window_end_ns:
                for k in ("fetch_s", "apply_s", "pause_s", "fetch_wait_s", "decode_pause_s", "stage_raised"):
                    if k in r.attrs or k in ("fetch_s", "apply_s", "pause_s", "fetch_wait_s"):  # the last two:
                        # only engines that switch in flight report them
                        updates[f"sync/{k}"] = updates.get(f"sync/{k}", 0.0) + float(r.attrs.get(k, 0.0))
                updates["sync/engine_updates"] = updates.get("sync/engine_updates", 0.0) + 1
        return cls(
            window_s=(window_end_ns - window_start_ns) / 1e9,
            per_worker=per_worker,
            worker_info=info,
            sync=sync,
            hub=hub,
            engine_updates=updates,
        )

    def _ratio_parts(self, select) -> tuple[float, float, int]:
        idle = observed = 0.0
        n = 0
        for w, secs in self.per_worker.items():
            if not select(*self.worker_info[w]):
                continue
            obs = sum(secs.values())
            if obs <= 0:
                continue
            n += 1
            observed += obs
            idle += sum(v for k, v in secs.items() if k not in PRODUCTIVE_STATES)
        return idle, observed, n

    def to_dict(self) -> dict[str, float]:
        out: dict[str, float] = {"stall/window_s": self.window_s}
        for side in SIDES:
            for state, cause in CAUSES.items():
                out[f"stall/{side}_{cause}_s"] = sum(
                    secs[state] for w, secs in self.per_worker.items() if self.worker_info[w][0] == side
                )
        out["stall/total_s"] = sum(out[k] for k in STALL_CAUSE_KEYS)
        for side in SIDES:
            idle, observed, _ = self._ratio_parts(lambda role, pool, s=side: role == s)
            if observed > 0:
                out[f"stall/{side}_idle_ratio"] = idle / observed
        pools = sorted({pool or role for role, pool in self.worker_info.values()})
        for p in pools:
            idle, observed, n = self._ratio_parts(lambda role, pool, p=p: (pool or role) == p)
            out[f"pool/{p}/workers"] = n
            if observed > 0:
                out[f"pool/{p}/idle_ratio"] = idle / observed
        out["sync/bytes"] = self.sync.bytes
        out["sync/seconds"] = self.sync.seconds
        out["sync/gbps"] = self.sync.gbps
        out["sync/fetches"] = self.sync.fetches
        out.update(self.engine_updates)
        if self.hub is not None:
            out["hub/replicas"] = self.hub.replicas
            out["hub/retained_versions"] = self.hub.retained_versions
            for k in ("plan_ms", "plan_ms_p99", "rpc_per_s", "heartbeat_lag_ms"):
                if getattr(self.hub, k) is not None:
                    out[f"hub/{k}"] = getattr(self.hub, k)
        return out


class StepAggregator:
    """The driver's buffer of drained records, cut into consecutive step windows.

        agg = StepAggregator()                 # first window starts now
        agg.add(records_from_all_workers)      # whenever workers' drain() results come back
        m = agg.close_step(hub=hub_stats)      # window [previous end, now); returns StepMetrics

    Records reaching past the window end are kept for the next window, so a wait that spans the
    boundary counts on both sides of it.
    """

    def __init__(self, start_ns: int | None = None) -> None:
        self.window_start_ns = now_ns() if start_ns is None else start_ns
        self._records: list[Record] = []

    def add(self, records: Iterable[Record]) -> None:
        self._records.extend(records)

    def close_step(
        self, end_ns: int | None = None, *, sync: SyncStats | None = None, hub: HubStats | None = None
    ) -> StepMetrics:
        end = now_ns() if end_ns is None else end_ns
        m = StepMetrics.compute(self._records, self.window_start_ns, end, sync=sync, hub=hub)
        self._records = [
            r
            for r in self._records
            if (r.end_ns > end if isinstance(r, Interval) else r.ts_ns >= end)
        ]
        self.window_start_ns = end
        return m
