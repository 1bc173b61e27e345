"""HubState's worker registry and replica queries: join, heartbeat, expiry; who holds what. No I/O.

A mixin of `HubState` (hub/state/__init__.py): it reads and writes the tables `HubState.__init__` creates
(`workers`, `replicas`, `fetches`, `models`, `pending_releases`, `suspects`).
"""
from __future__ import annotations

import logging

from rlsync.hub import errors as E
from rlsync.hub.state import retention
from rlsync.hub.model.names import base_model, is_variant_model
from rlsync.hub.model.location import Location
from rlsync.hub.state.records import ModelRec, ReplicaRec, WorkerRec

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
                moved = old.location != location
                if moved or "seed" in (old.role, role) or wid_is_target(self, old.id):
                    self._release_events.all()  # seed candidates and hand-off targets
                old.name, old.location, old.role, old.follow = name, location, role, follow
                old.last_seen = self.clock()
                if moved:
                    self._index.rebuild()  # its replicas and fetches are indexed by where it was
                return old.id
            self.remove_worker(worker_id)  # another process claims the id: the old registration goes
        wid = worker_id or f"w{self._prefix}{next(self._ids)}"
        self.workers[wid] = WorkerRec(wid, name, location, endpoint, self.clock(), role, follow)
        if role == "seed" or wid_is_target(self, wid):
            self._release_events.all()
        if wid in self._index.worker_replicas or wid in self._index.reader_fetches:
            self._index.rebuild()  # records of an id nobody held were indexed without a location
        return wid

    def touch(self, wid: str) -> WorkerRec:
        w = self.workers.get(wid)
        if w is None:
            raise E.NotJoinedError(f"worker {wid!r} is not joined (never joined, left, or expired)")
        w.last_seen = self.clock()
        return w

    def remove_worker(self, wid: str) -> list[str]:
        """Forget a worker (leave or expiry): its replicas, its fetches as reader. Returns replica ids."""
        w = self.workers.pop(wid, None)
        if w is not None and (w.role == "seed" or wid_is_target(self, wid)):
            self._release_events.all()
        idx = self._index
        gone = list(idx.worker_replicas.get(wid, ()))
        for fid in list(idx.reader_fetches.get(wid, ())):
            self.fetches.pop(fid)
        for rid in gone:
            self.replicas.pop(rid)
            self.pending_releases.discard(rid)
            self.suspects.pop(rid, None)
        for rid in gone:  # open fetches stop counting on the dead worker as a source
            for fid in list(idx.readers_of.get(rid, ())):
                self.fetches[fid].sources.pop(rid, None)
        return gone

    def silent_workers(self) -> list[str]:
        """Workers not heard from for `worker_timeout_s`."""
        cutoff = self.clock() - self.cfg.worker_timeout_s
        return [w.id for w in self.workers.values() if w.last_seen < cutoff]

    def expire(self, dead: list[str] | None = None) -> list[str]:
        """Remove the silent workers (or `dead`, as `silent_workers` just listed them)."""
        dead = self.silent_workers() if dead is None else [w for w in dead if w in self.workers]
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
        return [self.replicas[rid] for rid in self._index.shard_replicas.get((model, version, shard), ())]

    def is_retained(self, model: str, version: int) -> bool:
        m = self.models.get(model)
        if m is None:
            return False
        keep = self.retained_window(model)
        base = self.models.get(base_model(model)) if is_variant_model(model) else None
        if base is not None:  # a variant is needed while its base version is, not while it is its model's newest
            return retention.is_retained(version, base.committed, keep) or retention.is_retained(
                version, [], keep, pinned=(p.version for p in m.pins.values()),
                fetching=self._index.fetch_versions.get(model, ()))
        return retention.is_retained(version, m.committed, keep,
                                     pinned=(p.version for p in m.pins.values()),
                                     fetching=self._index.fetch_versions.get(model, ()))

    def inflight_from(self, replica_id: str) -> int:
        """Open fetches reading from this replica."""
        return len(self._index.readers_of.get(replica_id, ()))

    def worker_load(self, wid: str) -> int:
        """Open (fetch, source) pairs whose source is one of `wid`'s replicas: the planner's fan-out load."""
        return self._index.load.get(wid, 0)

    def _relay_fetches(self, relay: str) -> list[str]:
        """Open fetches whose target is replica `relay` (one, unless a plan was replaced), oldest first."""
        return list(self._index.relay_fetches.get(relay, ()))

    def holds_full(self, wid: str) -> bool:
        return any(self.replicas[rid].full for rid in self._index.worker_replicas.get(wid, ()))

    def stats(self) -> dict:
        return {"workers": len(self.workers), "replicas": len(self.replicas), "fetches": len(self.fetches),
                "models": {n: {"latest": m.latest, "committed": m.committed[-5:],
                               "retained": [v for v in m.versions if self.is_retained(n, v)]}
                           for n, m in self.models.items()}}


def wid_is_target(state, wid: str) -> bool:
    """`wid` is a seed worker some pending hand-off waits for (its arrival or loss changes that release)."""
    return bool(state.handoffs) and wid in state.handoffs.values()
