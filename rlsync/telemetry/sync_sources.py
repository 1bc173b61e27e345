"""Where fetched weights came from: trainer, peers or seed workers, and what crossed a DC. Pure logic.

Readers (rollout workers, seed workers) record a `fetch` event per completed fetch with the hub's
`FetchResult.bytes_by_source` (hub worker id -> bytes) and their own `dc`. The driver knows every
hub worker id it started or adopted (`Place`); an id it does not know is a trainer rank (the only
other workers that hold versions). Per step window:

- `sync/sources_used`: distinct source workers that served bytes;
- `sync/sources_trainer`, `sync/sources_peer`, `sync/sources_seed`: bytes served by trainer ranks, by
  rollout workers (peers), by seed workers;
- `sync/cross_dc_bytes`: bytes whose source is in another DC than the reader;
- `sync/cross_dc_copies`: Σ over fetches of cross-DC bytes / the fetch's model bytes (≈ versions
  that crossed in the window when the planner crosses once per version);
- `sync/join_fetches`, `sync/join_fetches_from_trainer`: first fetches of workers that joined a
  running job, and how many of them the trainer served any byte of.

Run totals (`SourceLedger.totals()`): the same sums plus `sync/cross_dc_copies_per_version` =
cross-DC bytes / (model bytes × versions that crossed at all): 1.0 when each version crossed once.

    ledger = SourceLedger(trainer_dc="dc0")
    ledger.places["w7"] = Place(kind="seed", dc="dc1")
    m = ledger.window(records, start_ns, end_ns)     # the keys above for one step
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from rlsync.core.events import FetchEvent
from rlsync.core.stall import Event, Record

__all__ = ["Place", "SourceLedger", "SOURCE_KINDS"]

SOURCE_KINDS = ("trainer", "peer", "seed")


@dataclass(frozen=True, slots=True)
class Place:
    kind: str
    """`trainer`, `peer` (a rollout worker) or `seed`."""
    dc: str
    """The DC label the worker joined the hub with."""
    pool: str = ""
    """Its pool (rollout workers), else empty."""


@dataclass
class SourceLedger:
    trainer_dc: str
    """DC of the trainer ranks (the place of any hub worker id not in `places`)."""
    places: dict[str, Place] = field(default_factory=dict)
    """Hub worker id -> where it is and what it is."""
    _cross_by_version: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    _model_bytes: int = 0
    _totals: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _carry: list[Event] = field(default_factory=list)

    def place(self, wid: str) -> Place:
        return self.places.get(wid) or Place(kind="trainer", dc=self.trainer_dc)

    def window(self, records: Iterable[Record], start_ns: int, end_ns: int) -> dict[str, float]:
        out = {f"sync/sources_{k}": 0.0 for k in SOURCE_KINDS}
        out.update({"sync/cross_dc_bytes": 0.0, "sync/cross_dc_copies": 0.0, "sync/join_fetches": 0.0,
                    "sync/join_fetches_from_trainer": 0.0})
        used: set[str] = set()
        fetches = [r for r in (*self._carry, *records) if isinstance(r, Event) and r.name == FetchEvent.NAME]
        # A fetch drained with this window but stamped after its end belongs to the next one.
        self._carry = [r for r in fetches if r.ts_ns >= end_ns]
        for r in fetches:
            if not start_ns <= r.ts_ns < end_ns:
                continue
            ev = FetchEvent.from_attrs(r.attrs)
            by_src = ev.bytes_by_source
            nbytes = ev.bytes or sum(by_src.values()) or 1
            reader_dc = ev.dc or self.trainer_dc
            cross = 0
            from_trainer = False
            for wid, n in by_src.items():
                if n <= 0:
                    continue
                p = self.place(wid)
                used.add(wid)
                out[f"sync/sources_{p.kind}"] += n
                from_trainer |= p.kind == "trainer"
                if p.dc != reader_dc:
                    cross += n
            out["sync/cross_dc_bytes"] += cross
            out["sync/cross_dc_copies"] += cross / nbytes
            if cross:
                self._cross_by_version[ev.version] += cross
                self._model_bytes = nbytes
            if ev.join:
                out["sync/join_fetches"] += 1
                out["sync/join_fetches_from_trainer"] += from_trainer
        out["sync/sources_used"] = float(len(used))
        for k, v in out.items():
            if k != "sync/sources_used":
                self._totals[k] += v
        return out

    def totals(self) -> dict[str, float]:
        t = dict(self._totals)
        versions = len(self._cross_by_version)
        t["sync/cross_dc_versions"] = float(versions)
        t["sync/cross_dc_copies_per_version"] = (
            sum(self._cross_by_version.values()) / (self._model_bytes * versions) if versions else 0.0)
        return t
