"""The planner: which replicas serve which units of one fetch. Pure logic, no I/O.

Rules, in order (DESIGN.md §2):
0. `source_hosts`, when set, removes every source on another host before the rules below.
1. Topology: a source in the reader's host beats its rack, its DC, then another DC.
2. Fan-out cap: a worker already serving `fanout_cap` fetches is not chosen while another source
   in a tier no worse is under its cap; in-progress readers (relays) are sources too, so with a cap
   of 1 a crowd of readers becomes a chain that pipelines (A→B→C ...).
3. Cross-DC: at most `cross_dc_streams` transfers of a version cross into one DC at a time; later
   readers there use in-DC relays even over their cap, so a version crosses the DC link ~once.
4. Within the chosen tier, peers before the publisher's own copy (offload the trainer: a joiner
   reads from rollouts whenever one holds the version), then least loaded, full before relay at
   equal load; units are striped over
   up to `max_sources` of them when the shard is at least `stripe_min_bytes`, but a stripe never takes
   a source's last free slot (load + 1 = cap): that slot serves a whole reader at full rate, not half
   of one (at cap 1 a read has one source; with 2, shuffled arrivals used up every free source and
   then formed one chain of hundreds of hops: docs/scale.md).
5. A backup (an offload seed: a host copy kept so that one kill cannot lose the version) serves only
   when no full live replica in the tier can: it is never striped in beside one.

At scale the hub does not offer every holder: `Fetches._nearest_sources` (hub/state/fetches.py) hands
over only what rules 1-3 let this planner pick (the nearest tier with a source under the cap). A rule
change here must keep that cut exact; tests/hub/state/test_scale_equivalence.py compares against the full list.

    >>> from rlsync.hub.model.location import Location
    >>> here = Location(host="a")
    >>> srcs = [Source("trainer", "w0", Location(host="b"), full=True, load=0)]
    >>> Planner(PlannerConfig()).choose_sources(here, srcs, [10, 10])
    {'trainer': [0, 1]}
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from rlsync.hub.model.location import CROSS_DC, Location


@dataclass(kw_only=True, slots=True)
class PlannerConfig:
    fanout_cap: int = 4
    """Concurrent fetches one worker serves before the planner prefers other sources."""
    max_sources: int = 2
    """Most sources one fetch stripes its units over."""
    stripe_min_bytes: int = 32 << 20
    """Shards smaller than this are read from a single source."""
    cross_dc_streams: int = 1
    """Concurrent transfers of one version allowed to cross into a DC; later readers relay in-DC."""
    source_hosts: tuple[str, ...] = ()
    """If set, only replicas on these hosts serve reads (every other holder is ignored as a source):
    e.g. every read pinned to the trainer's host, for a trainer-only baseline or to take relays out
    while debugging. A read no allowed host can serve fails with VersionLostError."""


class Source(NamedTuple):
    """One candidate replica as the planner sees it (a named tuple: a herd of 10^4 plans builds ~10^5;
    a frozen dataclass took 3 us each to build, a tuple 1 us)."""

    replica_id: str
    worker_id: str
    location: Location
    full: bool
    """True for a complete replica (live or seed); False for a relay still receiving."""
    load: int
    """Fetches currently reading from this worker (its uplink), across all its replicas."""
    origin: bool = False
    """The publisher's own copy (live or its offload seed): its uplink is the one a trainer stalls on."""
    backup: bool = False
    """An offload seed (rule 5): read only when no full live replica in the reader's tier can serve."""


def _order(s: Source) -> tuple:
    """Rule 4 within a tier: peers before the origin, least loaded, full before relay, then by id."""
    return (s.origin, s.load, not s.full, s.replica_id)


class Planner:
    def __init__(self, cfg: PlannerConfig) -> None:
        self.cfg = cfg
        self._hosts = frozenset(cfg.source_hosts)
        self._rr: dict[tuple[int, int], list[list[int]]] = {}
        self._last_total: tuple = ((), 0)

    def _total(self, unit_sizes) -> int:
        """sum(unit_sizes), remembered for the last tuple (the hub passes one tuple per manifest: summing
        1,000 sizes per plan was 7% of a herd). A tuple cannot change under the cache; a list is summed."""
        last, total = self._last_total
        if unit_sizes is last:
            return total
        total = sum(unit_sizes)
        if isinstance(unit_sizes, tuple):
            self._last_total = (unit_sizes, total)
        return total

    def choose_sources(self, reader: Location, sources: list[Source], unit_sizes: list[int],
                       cross_dc_inflight: int = 0) -> dict[str, list[int]]:
        """Map replica_id -> the unit indices it serves, in increasing order. No (allowed) source → {}."""
        if self._hosts:
            sources = [s for s in sources if s.location.host in self._hosts]
        if not sources:
            return {}
        cap = max(1, self.cfg.fanout_cap)
        dist = reader.distance
        ranked = [(dist(s.location), s) for s in sources]  # each distance once (a herd plans 10^4 times)
        # The nearest tier of the sources under the cap: where rule 1 and 2 would pick the best one.
        near = min((d for d, s in ranked if s.load < cap), default=None)
        relay_in_dc = cross_dc_inflight >= self.cfg.cross_dc_streams and any(d < CROSS_DC for d, _ in ranked)
        if near is not None and not (near == CROSS_DC and relay_in_dc):
            pool = [(d, s) for d, s in ranked if s.load < cap]
        elif relay_in_dc:
            # The version is already crossing into this DC: relay from inside it, over cap.
            pool = [(d, s) for d, s in ranked if d < CROSS_DC]
        else:
            pool = ranked
        best_tier = min(d for d, _ in pool)
        tier = [s for d, s in pool if d == best_tier]
        if len(tier) > 1:
            if any(s.full and not s.backup for s in tier):
                tier = [s for s in tier if not s.backup]
            tier.sort(key=_order)
        # One source per worker: two replicas on the same worker share its uplink.
        total = self._total(unit_sizes)
        n = min(1 if total < self.cfg.stripe_min_bytes else max(1, self.cfg.max_sources), len(unit_sizes)) or 1
        ids, seen = [], set()
        for s in tier:
            if s.worker_id not in seen and not (ids and s.load + 1 >= cap):  # rule 4: a stripe keeps last slots
                ids.append(s.replica_id)
                if len(ids) >= n:
                    break
                seen.add(s.worker_id)
        plan = dict(zip(ids, self._round_robin(len(unit_sizes), len(ids))))
        return {k: v for k, v in plan.items() if v} or {ids[0]: []}

    def _round_robin(self, units: int, ways: int) -> list[list[int]]:
        """Unit u goes to way u % ways. The lists are shared by every plan of that shape (a 1,000-unit
        list per plan was a third of a herd's planning): callers replace them, never change them."""
        rr = self._rr.get((units, ways))
        if rr is None:
            if len(self._rr) >= 64:
                self._rr.clear()
            rr = self._rr[(units, ways)] = [list(range(k, units, ways)) for k in range(ways)]
        return rr
