"""The hub's bookkeeping as a state machine: models, versions, replicas, fetches. No I/O.

The server feeds it one request at a time (it is single-threaded by design) and turns its answers
into replies. Every method validates its whole input before it changes anything, so a refused call
leaves the state exactly as it was. Durability goes through the `commit_hook` (the journal), which
runs before a commit becomes visible.

Replica ids are `worker:model:version:shard:slot`; slot is `live` (the worker's own buffers: a
trainer's parameters or a reader's fetch target) or `seed` (a host copy made by offload-seeding).
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from . import errors as E
from .location import CROSS_DC, Location
from .manifest import Manifest
from .planner import Planner, PlannerConfig, Source
from .retention import Decision, RetentionConfig, RetentionPolicy
from .shard import Shard

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class HubConfig:
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """Source selection (topology, fan-out cap, striping, cross-DC)."""
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    """Which versions stay retrievable, and how the last replica lets go."""
    worker_timeout_s: float = 15.0
    """A worker silent for this long (no RPC, no heartbeat) is expired and its replicas dropped."""
    ticket_ttl_s: float = 10.0
    """Lifetime of a data-plane ticket issued with a fetch plan. A reader opens its connections right
    after it gets the plan (a re-plan issues fresh tickets), so seconds suffice; hosts' clocks must
    agree to well within this."""
    suspect_s: float = 10.0
    """A source a reader reported dead or stalled gets no new reads for this long (or until it expires)."""
    reregister_grace_s: float = 5.0
    """After a restart (a journal with committed versions), a fetch or re-plan that finds no holder yet
    waits up to this long for workers to re-register before the hub says lost / not retained."""


@dataclass(slots=True)
class WorkerRec:
    id: str
    name: str
    location: Location
    endpoint: dict
    last_seen: float
    role: str = "worker"
    follow: bool = False
    tasks: list = field(default_factory=list)


@dataclass(slots=True)
class ReplicaRec:
    id: str
    worker: str
    model: str
    version: int
    shard: str
    slot: str
    full: bool
    releasing: bool = False
    origin: bool = False
    """Published by this worker (or its offload seed of such a copy), not fetched."""


@dataclass(slots=True)
class VersionRec:
    version: int
    group: tuple[int, int]
    manifests: dict[str, Manifest] = field(default_factory=dict)
    committed: bool = False


@dataclass(slots=True)
class FetchRec:
    id: str
    reader: str
    model: str
    version: int
    shard: str
    sources: dict[str, list[int]]
    relay: str
    started: float
    excluded: set[str] = field(default_factory=set)
    """Sources that failed this fetch: never planned for it again."""


@dataclass(slots=True)
class Pin:
    version: int
    size: int
    served: set[str] = field(default_factory=set)


KEEP_OLD = 64
"""Manifests of this many committed versions below the retained ones are kept (in memory and in the
journal); older versions nobody holds, pins or fetches are forgotten, their numbers stay reserved.
Without it the hub grew by every version's manifest for ever (`python -m rlsync.bench soak`)."""


@dataclass(slots=True)
class ModelRec:
    name: str
    versions: dict[int, VersionRec] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)
    pins: dict[str, Pin] = field(default_factory=dict)
    forgot_below: int = 0
    """Versions below this that are not in `versions` were forgotten (KEEP_OLD), not never committed."""

    @property
    def latest(self) -> int | None:
        return self.committed[-1] if self.committed else None


@dataclass(slots=True)
class Plan:
    fetch_id: str
    version: int
    manifest: Manifest
    sources: list[tuple[ReplicaRec, WorkerRec, list[int]]]
    held: bool = False
    """The reader already holds this version in full: nothing to transfer."""


class Release(str):
    """Outcome of a release step: DONE, SEED (copy first, then release again) or PENDING."""


DONE, SEED, PENDING = Release("done"), Release("seed"), Release("pending")


class HubState:
    def __init__(self, cfg: HubConfig, commit_hook: Callable[..., None] | None = None,
                 clock: Callable[[], float] = time.monotonic, id_prefix: str = "") -> None:
        self.cfg = cfg
        self.planner = Planner(cfg.planner)
        self.retention = RetentionPolicy(cfg.retention)
        self.commit_hook = commit_hook
        self.clock = clock
        self.workers: dict[str, WorkerRec] = {}
        self.models: dict[str, ModelRec] = {}
        self.replicas: dict[str, ReplicaRec] = {}
        self.fetches: dict[str, FetchRec] = {}
        self.pending_releases: set[str] = set()
        self.handoffs: dict[str, str] = {}     # releasing replica id -> seed worker asked to take it
        self.suspects: dict[str, float] = {}   # replica id -> no new reads until this time
        self._ids = itertools.count(1)
        self._prefix = id_prefix

    # ---------------------------------------------------------------- workers
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

    # ---------------------------------------------------------------- queries
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
        if version in m.committed[-self.cfg.retention.retain_last:]:
            return True
        if any(p.version == version for p in m.pins.values()):
            return True
        return any(f.model == model and f.version == version for f in self.fetches.values())

    def inflight_from(self, replica_id: str) -> int:
        return sum(1 for f in self.fetches.values() if replica_id in f.sources)

    def worker_load(self, wid: str) -> int:
        return sum(1 for f in self.fetches.values()
                   for rid in f.sources if self.replicas.get(rid, None) and self.replicas[rid].worker == wid)

    # ---------------------------------------------------------------- publish
    def publish(self, wid: str, model: str, version: int, shard: Shard, manifest: Manifest) -> bool:
        """Register `wid`'s live tensors as a full replica of (model, version, shard). True if it committed."""
        self.touch(wid)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise E.VersionError(f"version must be a non-negative int, got {version!r}")
        m = self.models.get(model)
        if m is not None and m.latest is not None and version <= m.latest:
            raise E.VersionError(f"{model!r} version {version} <= latest committed {m.latest}: "
                                 "versions are immutable and strictly increasing")
        v = m.versions.get(version) if m else None
        rid = f"{wid}:{model}:{version}:{shard.key}:live"
        if rid in self.replicas:
            raise E.VersionError(f"{model!r} v{version} {shard.key} already published by this worker")
        if v is not None:
            if v.group != shard.group:
                raise E.ShardError(f"{model!r} v{version} has group tp×pp={v.group}; this shard says {shard.group}")
            same = v.manifests.get(shard.key)
            if same is not None and same != manifest:
                raise E.ManifestMismatchError(
                    f"{model!r} v{version} {shard.key} was published with a different manifest "
                    "(other bytes or layout): a version is immutable")
            for key, other in v.manifests.items():
                if key.split("-")[1] == shard.key.split("-")[1] and key != shard.key:
                    a = [(t.name, t.dtype) for t in other.tensors]
                    b = [(t.name, t.dtype) for t in manifest.tensors]
                    if a != b:
                        raise E.ManifestMismatchError(
                            f"{model!r} v{version}: shard {shard.key}'s tensors (names/dtypes) disagree "
                            f"with shard {key} of the same pipeline stage")
        commits = (v is None and shard.group_count == 1) or (
            v is not None and shard.key not in v.manifests and len(v.manifests) + 1 == shard.group_count)
        if commits and self.commit_hook is not None:
            manifests = dict(v.manifests) if v else {}
            manifests[shard.key] = manifest
            self.commit_hook(model, version, shard.group, {k: x.to_wire() for k, x in manifests.items()})
        # -- validated (and journaled if committing): mutate
        if m is None:
            m = self.models[model] = ModelRec(model)
        if v is None:
            v = m.versions[version] = VersionRec(version, shard.group)
        v.manifests[shard.key] = manifest
        self.replicas[rid] = ReplicaRec(rid, wid, model, version, shard.key, "live", True, origin=True)
        if commits:
            v.committed = True
            m.committed.append(version)
            m.committed.sort()
            log.info("committed %s v%d (%d shard%s)", model, version, shard.group_count,
                     "s" if shard.group_count > 1 else "")
            self._forget_old(m)
        return commits

    def _forget_old(self, m: ModelRec) -> None:
        below = m.latest - self.cfg.retention.retain_last - KEEP_OLD
        if not m.versions or min(m.versions) >= below:
            return
        used = ({r.version for r in self.replicas.values() if r.model == m.name}
                | {p.version for p in m.pins.values()} | {f.version for f in self.fetches.values() if f.model == m.name})
        for v in [v for v in m.versions if v < below and v not in used]:
            del m.versions[v]
        m.committed = [v for v in m.committed if v in m.versions]
        m.forgot_below = below

    def restore_committed(self, model: str, version: int, group: tuple[int, int],
                          manifests: dict[str, Manifest]) -> None:
        """Re-create a committed version from the journal (no replicas: workers re-register them)."""
        m = self.models.setdefault(model, ModelRec(model))
        m.versions[version] = VersionRec(version, group, dict(manifests), True)
        if version not in m.committed:
            m.committed.append(version)
            m.committed.sort()

    def register_replica(self, wid: str, model: str, version: int, shard: Shard, slot: str,
                         manifest: Manifest) -> str:
        """A worker (re)announces a full replica of a committed version: seeds, and re-registration."""
        self.touch(wid)
        m = self.model(model)
        v = m.versions.get(version)
        if v is None or not v.committed:
            raise E.VersionNotFoundError(f"{model!r} v{version} is not committed")
        if v.manifests.get(shard.key) != manifest:
            raise E.ManifestMismatchError(f"{model!r} v{version} {shard.key}: manifest differs from the committed one")
        if slot not in ("live", "seed"):
            raise E.ProtocolError(f"unknown replica slot {slot!r}")
        rid = f"{wid}:{model}:{version}:{shard.key}:{slot}"
        live = self.replicas.get(f"{wid}:{model}:{version}:{shard.key}:live")
        origin = slot == "seed" and live is not None and live.origin
        rec = self.replicas.setdefault(rid, ReplicaRec(rid, wid, model, version, shard.key, slot, True, origin=origin))
        if not rec.full:
            # The worker holds it complete (it registers nothing else): a fetch of it this hub still has
            # open lost its fetch_done (restart, retry). Without this its release would be refused.
            for fid in [f.id for f in self.fetches.values() if f.relay == rid]:
                del self.fetches[fid]
            rec.full = True
        return rid

    # ---------------------------------------------------------------- fetch
    def plan_fetch(self, wid: str, model: str, version: int | str, shard: Shard,
                   group: tuple[str, int] | None = None, into_spec: list | None = None) -> Plan:
        reader = self.touch(wid)
        m = self.model(model)
        pin = None
        if group is not None:
            gname, gsize = group
            if not isinstance(gsize, int) or gsize < 1:
                raise E.ShardError(f"reader group size must be >= 1, got {gsize!r}")
            pin = m.pins.get(gname)
            if pin is None or shard.key in pin.served or pin.size != gsize:
                if m.latest is None:
                    raise E.VersionNotFoundError(f"{model!r} has no committed version yet")
                pin = Pin(m.latest, gsize)
            ver = pin.version
        elif version == "latest":
            if m.latest is None:
                raise E.VersionNotFoundError(f"{model!r} has no committed version yet")
            ver = m.latest
        elif isinstance(version, int) and not isinstance(version, bool):
            vr = m.versions.get(version)
            if vr is None and version < m.forgot_below:
                raise E.VersionNotRetainedError(f"{model!r} v{version} is no longer retained: the hub keeps the "
                                                f"newest {self.cfg.retention.retain_last + KEEP_OLD} versions "
                                                "(and older ones still held or fetched)")
            if vr is None or not vr.committed:
                raise E.VersionNotFoundError(f"{model!r} v{version} was never committed "
                                             f"(latest: {m.latest})")
            ver = version
        else:
            raise E.VersionError(f"version must be 'latest' or an int, got {version!r}")
        vr = m.versions[ver]
        if vr.group != shard.group:
            raise E.ShardError(f"{model!r} v{ver} has group tp×pp={vr.group}; reader asked {shard.group}")
        manifest = vr.manifests[shard.key]
        if into_spec is not None:
            check_into_spec(manifest, into_spec)
        relay_id = f"{wid}:{model}:{ver}:{shard.key}:live"
        stale = None
        if relay_id in self.replicas:
            stale = next((f.id for f in self.fetches.values() if f.relay == relay_id), None)
            if stale is None:
                if pin is not None:
                    m.pins[group[0]] = pin
                    pin.served.add(shard.key)
                    if len(pin.served) >= pin.size:
                        del m.pins[group[0]]
                return Plan("", ver, manifest, [], held=True)
            # The reader asks again for a fetch it has open: its first answer was lost (hub restart,
            # timeout). The old plan was never used; it is replaced below.
        cands = self._candidates(wid, model, ver, shard.key, exclude_fetch=stale)
        if not cands:
            if self.is_retained(model, ver):
                raise E.VersionLostError(f"{model!r} v{ver} {shard.key}: no replica can serve it "
                                         "(every holder died without notice or is releasing)")
            raise E.VersionNotRetainedError(f"{model!r} v{ver} is no longer retained and no worker holds it "
                                            f"(latest: {m.latest})")
        srcs = [Source(r.id, r.worker, self.workers[r.worker].location, r.full, self.worker_load(r.worker), r.origin)
                for r in cands]
        assignment = self.planner.choose_sources(reader.location, srcs, [u.nbytes for u in manifest.units],
                                                 cross_dc_inflight=self._crossing_into(reader, model, ver))
        if not assignment:
            raise self._no_allowed_source(model, ver, shard.key)
        # -- validated: mutate
        if stale is not None:
            del self.fetches[stale]
        if pin is not None:
            m.pins[group[0]] = pin
            pin.served.add(shard.key)
            if len(pin.served) >= pin.size:
                del m.pins[group[0]]
        fid = f"f{self._prefix}{next(self._ids)}"  # the epoch prefix: a restarted hub never reuses an id
        self.fetches[fid] = FetchRec(fid, wid, model, ver, shard.key, assignment, relay_id, self.clock())
        self.replicas[relay_id] = ReplicaRec(relay_id, wid, model, ver, shard.key, "live", full=False)
        return Plan(fid, ver, manifest,
                    [(self.replicas[rid], self.workers[self.replicas[rid].worker], units)
                     for rid, units in assignment.items()])

    def _no_allowed_source(self, model: str, ver: int, shard_key: str) -> E.VersionLostError:
        """Candidates existed but the planner's `source_hosts` excluded every one of them."""
        return E.VersionLostError(f"{model!r} v{ver} {shard_key}: no replica on the hosts the planner may read "
                                  f"from (source_hosts={list(self.planner.cfg.source_hosts)})")

    def _crossing_into(self, reader: WorkerRec, model: str, ver: int, exclude_fetch: str | None = None) -> int:
        """Open fetches of (model, ver) into the reader's DC that read from another DC."""
        def crosses(rid: str) -> bool:
            r = self.replicas.get(rid)
            return (r is not None and r.worker in self.workers
                    and self.workers[r.worker].location.distance(reader.location) == CROSS_DC)
        return sum(1 for f in self.fetches.values()
                   if f.id != exclude_fetch and f.model == model and f.version == ver and f.reader in self.workers
                   and self.workers[f.reader].location.dc == reader.location.dc and any(map(crosses, f.sources)))

    def _candidates(self, wid: str, model: str, ver: int, shard: str, exclude_fetch: str | None = None,
                    excluded: set[str] = frozenset()) -> list[ReplicaRec]:
        """Replicas a reader may read from: not itself, not downstream of it, not failed for this fetch.

        Preference: healthy replicas; then suspects (failed someone recently); last, full replicas
        that are releasing — a release waits for its readers anyway, and when a relay it waited for
        died, its own copy may be the only one left to read while it seeds."""
        now = self.clock()
        down = self._downstream(wid, model, ver, shard, exclude_fetch)
        ok = [r for r in self.replicas_of(model, ver, shard)
              if r.worker != wid and r.worker in self.workers and r.worker not in down and r.id not in excluded]
        live = [r for r in ok if not r.releasing]
        return ([r for r in live if self.suspects.get(r.id, 0) <= now] or live
                or [r for r in ok if r.full])

    def _downstream(self, wid: str, model: str, ver: int, shard: str, exclude_fetch: str | None) -> set[str]:
        """Workers whose open fetches read (transitively) from `wid`'s relay: never its sources."""
        down, frontier = set(), {f"{wid}:{model}:{ver}:{shard}:live"}
        while frontier:
            nxt = set()
            for f in self.fetches.values():
                if f.id != exclude_fetch and f.model == model and f.version == ver and f.shard == shard \
                        and frontier & set(f.sources) and f.reader not in down:
                    down.add(f.reader)
                    nxt.add(f.relay)
            frontier = nxt
        return down

    def replan(self, wid: str, fid: str, failed: list[str], units: list[int]) -> Plan:
        """A reader's sources `failed` (dead or stalled): mark them suspect, plan `units` elsewhere."""
        reader = self.touch(wid)
        f = self.fetches.get(fid)
        if f is None or f.reader != wid:
            raise E.UnknownFetchError(f"unknown fetch {fid!r} for worker {wid}")
        manifest = self.models[f.model].versions[f.version].manifests[f.shard]
        if any(not isinstance(u, int) or not 0 <= u < len(manifest.units) for u in units):
            raise E.ProtocolError("replan: unit ids out of range")
        until = self.clock() + self.cfg.suspect_s
        for rid in failed:
            if rid in self.replicas:
                self.suspects[rid] = until
                log.warning("fetch %s: source %s reported failed; suspect for %.0fs", fid, rid, self.cfg.suspect_s)
            f.sources.pop(rid, None)
            f.excluded.add(rid)
        cands = (self._candidates(wid, f.model, f.version, f.shard, exclude_fetch=fid, excluded=f.excluded)
                 # Every other holder failed this fetch once. A failure may have passed (a stall, a relay
                 # whose upstream died, a restart): a live holder that did not fail just now gets another try.
                 or self._candidates(wid, f.model, f.version, f.shard, exclude_fetch=fid, excluded=set(failed)))
        if not cands:
            raise E.VersionLostError(f"{f.model!r} v{f.version} {f.shard}: no replica other than the ones that "
                                     f"failed this fetch can serve its {len(units)} missing units")
        srcs = [Source(r.id, r.worker, self.workers[r.worker].location, r.full, self.worker_load(r.worker), r.origin)
                for r in cands]
        sub = self.planner.choose_sources(reader.location, srcs, [manifest.units[u].nbytes for u in units],
                                          cross_dc_inflight=self._crossing_into(reader, f.model, f.version, fid))
        if not sub:
            raise self._no_allowed_source(f.model, f.version, f.shard)
        assignment = {rid: [units[i] for i in idx] for rid, idx in sub.items()}
        for rid, us in assignment.items():
            f.sources[rid] = sorted(set(f.sources.get(rid, [])) | set(us))
        return Plan(fid, f.version, manifest,
                    [(self.replicas[rid], self.workers[self.replicas[rid].worker], us)
                     for rid, us in assignment.items()])

    def fetch_done(self, wid: str, fid: str, ok: bool) -> None:
        self.touch(wid)
        f = self.fetches.get(fid)
        if f is None or f.reader != wid:
            raise E.UnknownFetchError(f"unknown fetch {fid!r} for worker {wid}")
        del self.fetches[fid]
        if ok:
            self.replicas[f.relay].full = True
        else:
            self.replicas.pop(f.relay, None)

    # ---------------------------------------------------------------- release
    def release(self, wid: str, model: str, version: int, shard: Shard, slot: str = "live",
                handoff: bool = False) -> Release:
        """`handoff=True` (a worker leaving): the last replica hands off to a seed worker, not to itself."""
        self.touch(wid)
        rid = f"{wid}:{model}:{version}:{shard.key}:{slot}"
        if rid not in self.replicas:
            raise E.NotAReplicaError(f"worker {wid} holds no {slot} replica of {model!r} v{version} {shard.key}")
        if not self.replicas[rid].full:
            raise E.NotAReplicaError(f"{model!r} v{version} {shard.key} is still being fetched by this worker")
        if handoff:
            self.handoffs.setdefault(rid, "")
        return self.release_step(rid)

    def release_step(self, rid: str) -> Release:
        """One evaluation of a release; PENDING ones are re-evaluated by `poll_releases`."""
        r = self.replicas.get(rid)
        if r is None:
            self.pending_releases.discard(rid)
            return DONE
        peers = [p for p in self.replicas_of(r.model, r.version, r.shard) if p.id != rid]
        other_full = sum(1 for p in peers if p.full and not p.releasing)
        relays = sum(1 for p in peers if not p.full)
        d = self.retention.decide(retained=self.is_retained(r.model, r.version),
                                  other_full=other_full, relays=relays)
        if d is Decision.SEED and rid in self.handoffs:
            target = self.handoffs[rid]
            if not target or target not in self.workers:
                target = self._seed_worker_for(r)
            if target:
                if not self.handoffs[rid]:
                    self.workers[target].tasks.append([r.model, r.version, r.shard])
                    log.info("%s leaving: seed worker %s takes %s v%d %s", r.worker, target, r.model, r.version, r.shard)
                self.handoffs[rid] = target
                r.releasing = False  # keep serving: the seed worker reads from it
                self.pending_releases.add(rid)
                return PENDING
        if d is Decision.SEED:
            self.handoffs.pop(rid, None)
            if r.slot == "seed":
                raise E.HubError(f"{rid} is the last replica of a retained version: it cannot be released")
            r.releasing = False
            self.pending_releases.discard(rid)
            return SEED
        r.releasing = True  # the hub routes no new read to it from here on
        if d is Decision.WAIT_RELAY or self.inflight_from(rid) > 0:
            self.pending_releases.add(rid)
            return PENDING
        del self.replicas[rid]
        self.pending_releases.discard(rid)
        self.handoffs.pop(rid, None)
        return DONE

    def _seed_worker_for(self, r: ReplicaRec) -> str:
        """The nearest live seed worker that does not already hold or fetch this shard, or ''."""
        src = self.workers[r.worker].location
        holders = {p.worker for p in self.replicas_of(r.model, r.version, r.shard)}
        seeds = [w for w in self.workers.values() if w.role == "seed" and w.id not in holders]
        return min(seeds, key=lambda w: (src.distance(w.location), len(w.tasks), w.id)).id if seeds else ""

    def poll_releases(self) -> dict[str, Release]:
        """Re-evaluate pending releases; returns those that finished (DONE or SEED)."""
        out = {}
        for rid in list(self.pending_releases):
            res = self.release_step(rid)
            if res is not PENDING:
                out[rid] = res
        return out

    def drops_for(self, wid: str) -> list[str]:
        """Seeds of `wid` no longer needed (version not retained, nobody reading): dropped now.

        A seed worker's replicas are all seeds, whatever their slot."""
        w = self.workers.get(wid)
        out = []
        for r in list(self.replicas.values()):
            if (r.worker == wid and r.full and (r.slot == "seed" or (w and w.role == "seed"))
                    and not self.is_retained(r.model, r.version) and self.inflight_from(r.id) == 0
                    and r.id not in self.pending_releases):
                del self.replicas[r.id]
                out.append(r.id)
        return out

    def tasks_for(self, wid: str) -> list[list]:
        """Fetches a seed worker should start: hand-offs asked of it, and (if it follows) each latest."""
        w = self.workers[wid]
        tasks, w.tasks = w.tasks, []
        if w.follow:
            for m in self.models.values():
                if m.latest is None:
                    continue
                for key in m.versions[m.latest].manifests:
                    if f"{wid}:{m.name}:{m.latest}:{key}:live" not in self.replicas:
                        tasks.append([m.name, m.latest, key])
        group = {}
        for model, ver, key in tasks:
            group[(model, ver, key)] = list(self.models[model].versions[ver].group)
        return [[m, v, k, g] for (m, v, k), g in group.items()]

    def stats(self) -> dict:
        return {"workers": len(self.workers), "replicas": len(self.replicas), "fetches": len(self.fetches),
                "models": {n: {"latest": m.latest, "committed": m.committed[-5:],
                               "retained": [v for v in m.versions if self.is_retained(n, v)]}
                           for n, m in self.models.items()}}


def check_into_spec(manifest: Manifest, spec: list) -> None:
    """`spec` is [[name, dtype, shape], ...] of the reader's buffers; must match the manifest exactly."""
    try:
        have = {str(n): (str(d), tuple(int(x) for x in shp)) for n, d, shp in spec}
    except (TypeError, ValueError):
        raise E.ProtocolError("malformed into spec") from None
    want = {t.name: (t.dtype, t.shape) for t in manifest.tensors}
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        raise E.BufferMismatchError(f"into tensors: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, (dt, shp) in want.items():
        if have[name] != (dt, shp):
            raise E.BufferMismatchError(f"into[{name!r}] is {have[name][1]} {have[name][0]}; "
                                        f"the version has {shp} {dt}")
