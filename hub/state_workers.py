"""HubState's worker registry and replica queries: join, heartbeat, expiry; who holds what. No I/O.

A mixin of `HubState` (hub/state.py): it reads and writes the tables `HubState.__init__` creates
(`workers`, `replicas`, `fetches`, `models`, `pending_releases`, `suspects`).
"""
from __future__ import annotations

import logging

from . import errors as E
from . import retention
from .location import Location
from .state_records import ModelRec, ReplicaRec, WorkerRec

log = logging.getLogger("rlsync.hub.state")


class Workers:
    """Join, leave, expiry, and the queries every other protocol asks of the tables."""

    def join(self, name: str, location: Location, endpoint: dict, worker_id: str | None = None,
             role: str = "worker", follow: bool = False) -> str:
        """Add a worker; `worker_id` re-joins under a known id (after a hub restart or failover)."""
        if role not in ("worker", "seed"):
            raise E.ProtocolError(f"unknown worker role {role!r}")
        old = self.workers.get(worker_id) if worker_id is not None else None
        if old is not None:
            if old.endpoint == endpoint:
                # The same process joining again (two of its threads saw NotJoined at once, or a
                # re-join's answer was lost): keep the replicas it serves and the fetches it runs.
                old.name, old.location, old.role, old.follow = name, location, role, follow
                old.last_seen = self.clock()
                return old.id
            self.remove_worker(worker_id)  # another process claims the id: the old registration goes
        wid = worker_id or f"w{self._prefix}{next(self._ids)}"
        self.workers[wid] = WorkerRec(wid, name, location, endpoint, self.clock(), role, follow)
        return wid

    def touch(self, wid: str) -> WorkerRec:
        w = self.workers.get(wid)
        if w is None:
            raise E.NotJoinedError(f"worker {wid!r} is not joined (never joined, left, or expired)")
        w.last_seen = self.clock()
        return w

    def remove_worker(self, wid: str) -> list[str]:
        """Forget a worker (leave or expiry): its replicas, its fetches as reader. Returns replica ids."""
        self.workers.pop(wid, None)
        gone = [r for r in self.replicas if self.replicas[r].worker == wid]
        for fid in [f.id for f in self.fetches.values() if f.reader == wid]:
            self.fetches.pop(fid)
        for rid in gone:
            self.replicas.pop(rid)
            self.pending_releases.discard(rid)
            self.suspects.pop(rid, None)
        for f in self.fetches.values():  # open fetches stop counting on the dead worker as a source
            for rid in gone:
                f.sources.pop(rid, None)
        return gone

    def expire(self) -> list[str]:
        cutoff = self.clock() - self.cfg.worker_timeout_s
        dead = [w.id for w in self.workers.values() if w.last_seen < cutoff]
        for wid in dead:
            log.warning("worker %s (%s) expired: no heartbeat for %.1fs", wid,
                        self.workers[wid].name, self.cfg.worker_timeout_s)
            self.remove_worker(wid)
        return dead

    def model(self, name: str) -> ModelRec:
        m = self.models.get(name)
        if m is None or not m.versions:
            raise E.UnknownModelError(f"unknown model {name!r}; known: {sorted(self.models)[:10]}")
        return m

    def replicas_of(self, model: str, version: int, shard: str) -> list[ReplicaRec]:
        return [r for r in self.replicas.values()
                if r.model == model and r.version == version and r.shard == shard]

    def is_retained(self, model: str, version: int) -> bool:
        m = self.models.get(model)
        if m is None:
            return False
        return retention.is_retained(version, m.committed, self.cfg.retention.retain_last,
                                     pinned=(p.version for p in m.pins.values()),
                                     fetching=(f.version for f in self.fetches.values() if f.model == model))

    def inflight_from(self, replica_id: str) -> int:
        return sum(1 for f in self.fetches.values() if replica_id in f.sources)

    def worker_load(self, wid: str) -> int:
        return sum(1 for f in self.fetches.values()
                   for rid in f.sources if self.replicas.get(rid, None) and self.replicas[rid].worker == wid)

    def stats(self) -> dict:
        return {"workers": len(self.workers), "replicas": len(self.replicas), "fetches": len(self.fetches),
                "models": {n: {"latest": m.latest, "committed": m.committed[-5:],
                               "retained": [v for v in m.versions if self.is_retained(n, v)]}
                           for n, m in self.models.items()}}
