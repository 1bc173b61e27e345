"""HubState's release protocol: release steps, hand-offs to seed workers, seed drops and tasks. No I/O.

A mixin of `HubState` (hub/state/__init__.py). Every decision (release now, wait, hand off, seed, refuse;
which seed worker; which seeds to drop) is pure logic in hub/state/retention.py; this module gathers the
snapshot it needs and applies the answer.
"""
from __future__ import annotations

import logging

from rlsync.hub import errors as E
from rlsync.hub.model.names import DerivedName
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.state.retention import Action, ReleaseView, SeedWorker, choose_seed_worker, drop_seed
from rlsync.hub.model.shard import Shard
from rlsync.hub.state.records import DONE, PENDING, SEED, Release, ReplicaRec

log = logging.getLogger("rlsync.hub.state")


class ReleaseEvents:
    """What changed since the pending releases were last evaluated, so `poll_releases` re-evaluates
    only those an event may have changed (a pass over every pending release, each counting every holder
    of its shard, cost 1.24 ms per event-loop pass at 10k holders). A release's view reads its shard's
    replicas (and their full / releasing flags), the fetches reading from it, its version's retention
    (commits, pins, fetches of the version), seed workers with their tasks, and its hand-off target.
    Nothing is recorded while no release is pending: a release is evaluated when it is asked."""

    MAX_KEYS = 4096
    """Beyond this many changed shards between two polls, every pending release is re-evaluated."""

    def __init__(self, pending: set) -> None:
        self.pending = pending
        self.everything = False
        self.keys: set[tuple] = set()      # (model, version, shard): its replicas or reads from them changed
        self.versions: set[tuple] = set()  # (model, version): a fetch of it opened or closed
        self.models: set[str] = set()      # commits, forgetting, reader-group pins

    def shard(self, model: str, version: int, shard: str) -> None:
        if self.pending:
            self.keys.add((model, version, shard))
            if len(self.keys) > self.MAX_KEYS:
                self.everything = True
                self.keys.clear()

    def version(self, model: str, version: int) -> None:
        if self.pending:
            self.versions.add((model, version))

    def model(self, model: str) -> None:
        if self.pending:
            self.models.add(model)

    def all(self) -> None:
        if self.pending:
            self.everything = True

    def take(self) -> tuple[bool, set, set, set]:
        out = (self.everything, self.keys, self.versions, self.models)
        self.everything, self.keys, self.versions, self.models = False, set(), set(), set()
        return out


class Releases:
    """Release, hand off, drop seeds, hand seed workers their tasks."""

    def release(self, wid: str, model: str, version: int, shard: Shard, slot: str = "live",
                handoff: bool = False) -> Release:
        """`handoff=True` (a worker leaving): the last replica hands off to a seed worker, not to itself."""
        self.touch(wid)
        rid = ReplicaId(wid, model, version, shard.key, slot).wire
        if rid not in self.replicas:
            raise E.NotAReplicaError(f"worker {wid} holds no {slot} replica of {model!r} v{version} {shard.key}")
        if not self.replicas[rid].full:
            raise E.NotAReplicaError(f"{model!r} v{version} {shard.key} is still being fetched by this worker")
        if handoff and rid not in self.handoffs:
            self.handoffs[rid] = ""
            self._release_events.shard(model, version, shard.key)
        return self.release_step(rid)

    def release_if_free(self, wid: str, model: str, version: int, shard: Shard) -> bool:
        """Release `wid`'s live replica of (model, version, shard) only if retention would drop it now
        (no read in flight from it, no copy it must keep): True then; False, changing nothing, for
        anything else (not held, still fetching, being released or handed off, would wait or seed)."""
        rid = ReplicaId(wid, model, version, shard.key, "live").wire
        r = self.replicas.get(rid)
        if r is None or not r.full or r.releasing or rid in self.handoffs or rid in self.pending_releases:
            return False
        if self.policy(r.model).retention.decide_release(self._release_view(r)).action is not Action.RELEASE:
            return False
        return self.release_step(rid) is DONE

    def release_step(self, rid: str) -> Release:
        """One evaluation of a release (`retention.decide_release`); PENDING ones are re-evaluated
        by `poll_releases`. This gathers the view and applies the decision; it decides nothing."""
        r = self.replicas.get(rid)
        if r is None:
            self.pending_releases.discard(rid)
            return DONE
        d = self.policy(r.model).retention.decide_release(self._release_view(r))
        ev = self._release_events
        if d.action is Action.HANDOFF:
            if d.ask:
                self.workers[d.target].tasks.append([r.model, r.version, r.shard])
                ev.all()  # a seed worker's task count orders the seed candidates
                log.info("%s leaving: seed worker %s takes %s v%d %s", r.worker, d.target, r.model, r.version, r.shard)
            if self.handoffs.get(rid) != d.target or r.releasing:
                ev.shard(r.model, r.version, r.shard)
            self.handoffs[rid] = d.target
            r.releasing = False  # keep serving: the seed worker reads from it
            self.pending_releases.add(rid)
            return PENDING
        if d.action in (Action.SEED, Action.REFUSE):
            if self.handoffs.pop(rid, None) is not None or r.releasing:
                ev.shard(r.model, r.version, r.shard)
            if d.action is Action.REFUSE:
                raise E.LastReplicaError(f"{rid} is the last replica of a retained version: it cannot be released")
            r.releasing = False
            self.pending_releases.discard(rid)
            return SEED
        if not r.releasing:
            ev.shard(r.model, r.version, r.shard)
        r.releasing = True  # the hub routes no new read to it from here on
        if d.action is Action.WAIT:
            self.pending_releases.add(rid)
            return PENDING
        del self.replicas[rid]
        self.pending_releases.discard(rid)
        self.handoffs.pop(rid, None)
        return DONE

    def _release_view(self, r: ReplicaRec) -> ReleaseView:
        """The snapshot `decide_release` needs of replica `r` (read-only)."""
        peers = [p for p in self.replicas_of(r.model, r.version, r.shard) if p.id != r.id]
        leaving = r.id in self.handoffs
        target = self.handoffs.get(r.id, "")
        target = target if target in self.workers else ""  # the one asked before died: ask another
        # A leaving worker's other copies (its seeds) go with it: they are not "other" copies then.
        others = [p for p in peers if p.full and not p.releasing and not (leaving and p.worker == r.worker)]
        return ReleaseView(retained=self.is_retained(r.model, r.version), other_full=len(others),
                           relays=sum(1 for p in peers if not p.full), inflight=self.inflight_from(r.id),
                           seed_slot=r.slot == "seed", leaving=leaving, handoff_target=target,
                           seed_candidate=self._seed_worker_for(r) if leaving and not target else "",
                           # a derived object (NAME@delta, NAME@bf16) is made again from its base: losing it
                           # costs a full fetch or a derivation, not a version
                           origin=r.origin and r.slot == "live" and DerivedName.parse(r.model) is None,
                           own_seed=any(p.worker == r.worker and p.slot == "seed" and p.full for p in peers))

    def _seed_worker_for(self, r: ReplicaRec) -> str:
        """The nearest live seed worker that does not already hold or fetch this shard, or ''."""
        return choose_seed_worker(self.workers[r.worker].location,
                                  [SeedWorker(w.id, w.location, len(w.tasks)) for w in self.workers.values()
                                   if w.role == "seed"],
                                  holders=[p.worker for p in self.replicas_of(r.model, r.version, r.shard)])

    def poll_releases(self) -> dict[str, Release]:
        """Re-evaluate the pending releases an event may have changed (`ReleaseEvents`; the others would
        answer PENDING again and change nothing); returns those that finished (DONE or SEED)."""
        out = {}
        everything, keys, versions, models = self._release_events.take()
        for rid in list(self.pending_releases):
            r = self.replicas.get(rid)
            if not (everything or r is None or r.model in models or (r.model, r.version) in versions
                    or (r.model, r.version, r.shard) in keys):
                continue
            res = self.release_step(rid)
            if res is not PENDING:
                out[rid] = res
        return out

    def drops_for(self, wid: str) -> list[str]:
        """Seeds of `wid` no longer needed (version not retained, nobody reading): dropped now.

        A seed worker's replicas are all seeds, whatever their slot."""
        w = self.workers.get(wid)
        out = []
        for r in [self.replicas[rid] for rid in self._index.worker_replicas.get(wid, ())]:
            if (r.full and (r.slot == "seed" or (w and w.role == "seed"))
                    and drop_seed(retained=self.is_retained(r.model, r.version), inflight=self.inflight_from(r.id),
                                  releasing=r.id in self.pending_releases, redundant=self._redundant_seed(r))):
                del self.replicas[r.id]
                out.append(r.id)
        return out

    def _redundant_seed(self, r: ReplicaRec) -> bool:
        """An offload seed with `min_full_copies` other full live copies (not releasing) beside it."""
        if r.slot != "seed":
            return False
        live = [p for p in self.replicas_of(r.model, r.version, r.shard)
                if p.id != r.id and p.full and p.slot == "live" and not p.releasing]
        return len(live) >= self.policy(r.model).retention.cfg.min_full_copies

    def tasks_for(self, wid: str) -> list[list]:
        """Fetches a seed worker should start: hand-offs asked of it, and (if it follows) each latest."""
        w = self.workers[wid]
        tasks, w.tasks = w.tasks, []
        if tasks:
            self._release_events.all()  # a seed worker's task count orders the seed candidates
        if w.follow:
            for m in self.models.values():
                if m.latest is None:
                    continue
                for key in m.versions[m.latest].manifests:
                    if ReplicaId(wid, m.name, m.latest, key).wire not in self.replicas:
                        tasks.append([m.name, m.latest, key])
        group = {}
        for model, ver, key in tasks:
            group[(model, ver, key)] = list(self.models[model].versions[ver].group)
        return [[m, v, k, g] for (m, v, k), g in group.items()]
