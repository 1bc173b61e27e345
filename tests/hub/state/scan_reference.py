"""A test-only reference for the hub's indexed state: the scan-over-every-table queries it replaced.

`ScanState` is `HubState` with each indexed query (hub/state/index.py) answered by the plain scan the
hub used before issue 19 (plans, retention, expiry and drops then read only the scans).
tests/hub/state/test_scale_equivalence.py runs random operation sequences on both and compares everything.
"""
from __future__ import annotations

from rlsync.hub.state import retention
from rlsync.hub.model.location import CROSS_DC
from rlsync.hub.state.planner import Planner, Source
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.state.retention import drop_seed
from rlsync.hub.state import PENDING, HubState


class ReferencePlanner(Planner):
    """The planner's rules as first written (before issue 19's per-plan savings): what `Planner` must answer."""

    def choose_sources(self, reader, sources, unit_sizes, cross_dc_inflight=0, total_bytes=None):
        if self._hosts:
            sources = [s for s in sources if s.location.host in self._hosts]
        if not sources:
            return {}
        cap = max(1, self.cfg.fanout_cap)

        def rank(s):
            return (reader.distance(s.location), not s.full, s.load, s.replica_id)

        under = [s for s in sources if s.load < cap]
        in_dc = [s for s in sources if reader.distance(s.location) < CROSS_DC]
        if under:
            best = min(under, key=rank)
            if (reader.distance(best.location) == CROSS_DC and in_dc
                    and cross_dc_inflight >= self.cfg.cross_dc_streams):
                pool = in_dc
            else:
                pool = under
        else:
            pool = in_dc if (in_dc and cross_dc_inflight >= self.cfg.cross_dc_streams) else sources
        best_tier = min(reader.distance(s.location) for s in pool)
        tier = [s for s in pool if reader.distance(s.location) == best_tier]
        if any(s.full and not s.backup for s in tier):
            tier = [s for s in tier if not s.backup]
        tier.sort(key=lambda s: (s.origin, s.load, not s.full, s.replica_id))
        chosen, seen = [], set()
        for s in tier:
            if s.worker_id not in seen and not (chosen and s.load + 1 >= cap):  # a stripe keeps last slots
                chosen.append(s)
                seen.add(s.worker_id)
        n = 1 if sum(unit_sizes) < self.cfg.stripe_min_bytes else max(1, self.cfg.max_sources)
        chosen = chosen[:min(n, len(unit_sizes)) or 1]
        ids = [s.replica_id for s in chosen]
        plan = dict(zip(ids, self._round_robin(len(unit_sizes), len(ids))))
        return {k: v for k, v in plan.items() if v} or {ids[0]: []}


class ScanState(HubState):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.planner = ReferencePlanner(self.cfg.planner)

    def replicas_of(self, model, version, shard):
        return [r for r in self.replicas.values() if r.model == model and r.version == version and r.shard == shard]

    def is_retained(self, model, version):
        m = self.models.get(model)
        if m is None:
            return False
        return retention.is_retained(version, m.committed, self.cfg.retention.retain_last,
                                     pinned=(p.version for p in m.pins.values()),
                                     fetching=(f.version for f in self.fetches.values() if f.model == model))

    def inflight_from(self, replica_id):
        return sum(1 for f in self.fetches.values() if replica_id in f.sources)

    def worker_load(self, wid):
        return sum(1 for f in self.fetches.values()
                   for rid in f.sources if self.replicas.get(rid, None) and self.replicas[rid].worker == wid)

    def holds_full(self, wid):
        return any(r.full for r in self.replicas.values() if r.worker == wid)

    def held_versions(self, model):
        full = {(r.version, r.shard) for r in self.replicas.values() if r.model == model and r.full}
        m = self.models.get(model)
        return [v for v in (m.committed if m else ()) if all((v, k) in full for k in m.versions[v].manifests)]

    def remove_worker(self, wid):
        self.workers.pop(wid, None)
        gone = [r for r in self.replicas if self.replicas[r].worker == wid]
        for fid in [f.id for f in self.fetches.values() if f.reader == wid]:
            self.fetches.pop(fid)
        for rid in gone:
            self.replicas.pop(rid)
            self.pending_releases.discard(rid)
            self.suspects.pop(rid, None)
        for f in self.fetches.values():
            for rid in gone:
                f.sources.pop(rid, None)
        return gone

    def _crossing_into(self, reader, model, ver, exclude_fetch=None):
        def crosses(rid):
            r = self.replicas.get(rid)
            return (r is not None and r.worker in self.workers
                    and self.workers[r.worker].location.distance(reader.location) == CROSS_DC)
        return sum(1 for f in self.fetches.values()
                   if f.id != exclude_fetch and f.model == model and f.version == ver and f.reader in self.workers
                   and self.workers[f.reader].location.dc == reader.location.dc and any(map(crosses, f.sources)))

    def _downstream(self, wid, model, ver, shard, exclude_fetch):
        down, frontier = set(), {ReplicaId(wid, model, ver, shard).wire}
        while frontier:
            nxt = set()
            for f in self.fetches.values():
                if f.id != exclude_fetch and f.model == model and f.version == ver and f.shard == shard \
                        and frontier & set(f.sources) and f.reader not in down:
                    down.add(f.reader)
                    nxt.add(f.relay)
            frontier = nxt
        return down

    def _nearest_sources(self, reader, model, ver, shard, exclude_fetch):
        return [Source(r.id, r.worker, self.workers[r.worker].location, r.full, self.worker_load(r.worker), r.origin,
                       backup=r.slot == "seed")
                for r in self._candidates(reader.id, model, ver, shard, exclude_fetch=exclude_fetch)]

    def poll_releases(self):  # every pending release re-evaluated on every poll, events or not
        out = {}
        for rid in list(self.pending_releases):
            res = self.release_step(rid)
            if res is not PENDING:
                out[rid] = res
        return out

    def _relay_fetches(self, relay):
        return [f.id for f in self.fetches.values() if f.relay == relay]

    def _forget_old(self, m):
        below = retention.forget_below(m.latest, self.cfg.retention.retain_last)
        if not m.versions or min(m.versions) >= below:
            return
        used = ({r.version for r in self.replicas.values() if r.model == m.name}
                | {p.version for p in m.pins.values()} | {f.version for f in self.fetches.values() if f.model == m.name})
        for v in retention.forgettable(list(m.versions), below, used):
            del m.versions[v]
        m.committed = [v for v in m.committed if v in m.versions]
        m.forgot_below = below

    def drops_for(self, wid):
        w = self.workers.get(wid)
        out = []
        for r in list(self.replicas.values()):
            if (r.worker == wid and r.full and (r.slot == "seed" or (w and w.role == "seed"))
                    and drop_seed(retained=self.is_retained(r.model, r.version), inflight=self.inflight_from(r.id),
                                  releasing=r.id in self.pending_releases,
                                  redundant=r.slot == "seed" and sum(
                                      1 for p in self.replicas.values()
                                      if (p.model, p.version, p.shard) == (r.model, r.version, r.shard) and p.id != r.id
                                      and p.full and p.slot == "live" and not p.releasing
                                  ) >= self.cfg.retention.min_full_copies)):
                del self.replicas[r.id]
                out.append(r.id)
        return out
