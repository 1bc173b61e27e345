"""HubState's fetch protocol: plan a fetch (sources via the planner), re-plan around failed sources,
finish it. No I/O; data-plane tickets are issued by the server from the returned `Plan`.

A mixin of `HubState` (hub/state/__init__.py).
"""
from __future__ import annotations

import logging

from rlsync.hub import errors as E
from rlsync.hub.model.location import CROSS_DC
from rlsync.hub.model.manifest import BufferSpec, Manifest, check_buffers
from rlsync.hub.state.planner import Source
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.state.retention import KEEP_OLD
from rlsync.hub.model.shard import Shard
from rlsync.hub.state.index import place_keys
from rlsync.hub.state.records import FetchRec, HolderSilentError, Pin, Plan, ReplicaRec, WorkerRec

log = logging.getLogger("rlsync.hub.state")


class Fetches:
    """Plan, re-plan and finish fetches; relays are registered as partial replicas."""

    def plan_fetch(self, wid: str, model: str, version: int | str, shard: Shard,
                   group: tuple[str, int] | None = None, into_spec: list | None = None, relay: bool = True) -> Plan:
        """`relay=False`: a partial reader (hub/client/partial.py) that will never hold the whole shard: it is
        not advertised as a relay, so no reader is ever planned on it, and its fetch cannot end as a replica."""
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
        else:
            ver = self.resolve_version(m, model, version)
        manifest = self.shard_manifest(m, model, ver, shard, into_spec)
        relay_id = ReplicaId(wid, model, ver, shard.key).wire
        stale = None
        if relay_id in self.replicas:
            stale = next(iter(self._relay_fetches(relay_id)), None)
            if stale is not None and not relay:
                stale = None  # the worker's own open relay fetch is another fetch: leave it alone
            elif stale is None:
                if pin is not None:
                    self._pin(m, group[0], pin, shard.key)
                return Plan("", ver, manifest, [], held=True)
            # The reader asks again for a fetch it has open: its first answer was lost (hub restart,
            # timeout). The old plan was never used; it is replaced below.
        srcs = self._nearest_sources(reader, model, ver, shard.key, stale)
        if not srcs:
            older = self._held_below(m, ver, shard.key) if version == "latest" and pin is None else None
            if older is not None:  # 'latest' is the newest version someone can serve now
                log.warning("%r v%d has no live holder: 'latest' for %s is v%d", model, ver, wid, older)
                return self.plan_fetch(wid, model, older, shard, None, into_spec, relay=relay)
            if self.is_retained(model, ver):
                raise E.VersionLostError(f"{model!r} v{ver} {shard.key}: no replica can serve it "
                                         "(every holder died without notice or is releasing)")
            raise E.VersionNotRetainedError(f"{model!r} v{ver} is no longer retained and no worker holds it "
                                            f"(latest: {m.latest})")
        assignment = self.policy(model).planner.choose_sources(reader.location, srcs, self._unit_sizes(manifest),
                                                 cross_dc_inflight=self._crossing_into(reader, model, ver))
        if not assignment:
            raise self._no_allowed_source(model, ver, shard.key)
        # -- validated: mutate
        if stale is not None:
            del self.fetches[stale]
        if pin is not None:
            self._pin(m, group[0], pin, shard.key)
        fid = f"f{self._prefix}{next(self._ids)}"  # the epoch prefix: a restarted hub never reuses an id
        self.fetches[fid] = FetchRec(fid, wid, model, ver, shard.key, assignment, relay_id if relay else "", self.clock())
        if relay:
            self.replicas[relay_id] = ReplicaRec(relay_id, wid, model, ver, shard.key, "live", full=False)
        return Plan(fid, ver, manifest,
                    [(self.replicas[rid], self.workers[self.replicas[rid].worker], units)
                     for rid, units in assignment.items()])


    def _held_below(self, m, ver: int, shard_key: str) -> int | None:
        """The newest committed version below `ver` of which a live worker holds a full replica."""
        for v in reversed(m.committed):
            if v < ver and any(r.full and r.worker in self.workers and not r.releasing
                               for r in self.replicas_of(m.name, v, shard_key)):
                return v
        return None

    def _pin(self, m, gname: str, pin: Pin, shard_key: str) -> None:
        """A reader group's member is answered: the group stays on `pin`'s version until all are."""
        m.pins[gname] = pin
        pin.served.add(shard_key)
        if len(pin.served) >= pin.size:
            del m.pins[gname]
        self._release_events.model(m.name)  # pins keep a version retained

    def resolve_version(self, m, model: str, version: int | str) -> int:
        """The committed version `version` ('latest' or an int) names, or a typed error."""
        if version == "latest":
            if m.latest is None:
                raise E.VersionNotFoundError(f"{model!r} has no committed version yet")
            return m.latest
        if not isinstance(version, int) or isinstance(version, bool):
            raise E.VersionError(f"version must be 'latest' or an int, got {version!r}")
        vr = m.versions.get(version)
        if vr is None and version < m.forgot_below:
            raise E.VersionNotRetainedError(f"{model!r} v{version} is no longer retained: the hub keeps the "
                                            f"newest {self.retained_window(model) + KEEP_OLD} versions "
                                            "(and older ones still held or fetched)")
        if vr is None or not vr.committed:
            raise E.VersionNotFoundError(f"{model!r} v{version} was never committed (latest: {m.latest})")
        return version

    def shard_manifest(self, m, model: str, ver: int, shard: Shard, into_spec: list | None = None) -> Manifest:
        """v`ver`'s manifest of `shard`, checked against the reader's group and its `into` tensors."""
        vr = m.versions[ver]
        if vr.group != shard.group:
            raise E.ShardError(f"{model!r} v{ver} has group tp×pp={vr.group}; reader asked {shard.group}")
        manifest = vr.manifests[shard.key]
        if into_spec is not None:
            check_into_spec(manifest, into_spec)
        return manifest

    def _unit_sizes(self, manifest: Manifest) -> tuple[int, ...]:
        """Every unit's size, computed once per manifest (a 1,000-unit list per plan showed in the herd);
        a tuple, so the planner may remember its sum."""
        hit = self._sizes.get(id(manifest))
        if hit is None or hit[0] is not manifest:
            if len(self._sizes) >= 16:  # each entry keeps its manifest alive: bound it to what is live
                self._sizes.clear()
            hit = self._sizes[id(manifest)] = (manifest, tuple(u.nbytes for u in manifest.units))
        return hit[1]

    def _no_allowed_source(self, model: str, ver: int, shard_key: str) -> E.VersionLostError:
        """Candidates existed but the planner's `source_hosts` excluded every one of them."""
        return E.VersionLostError(f"{model!r} v{ver} {shard_key}: no replica on the hosts the planner may read "
                                  f"from (source_hosts={list(self.policy(model).planner.cfg.source_hosts)})")

    def _crossing_into(self, reader: WorkerRec, model: str, ver: int, exclude_fetch: str | None = None) -> int:
        """Open fetches of (model, ver) into the reader's DC that read from another DC."""
        key = (model, ver, reader.location.dc)
        n = self._index.crossing.get(key, 0)
        return n - 1 if exclude_fetch is not None and self._index.crosses.get(exclude_fetch) == key else n

    def _nearest_sources(self, reader: WorkerRec, model: str, ver: int, shard: str,
                         exclude_fetch: str | None) -> list[Source]:
        """The planner's input for a fresh plan: what `_candidates` returns, cut to what the planner can pick.
        Tiers (host, rack, DC, other DCs) are walked nearest first. The planner takes the nearest tier
        with a source under the fan-out cap, from its sources under the cap; only when that tier is another
        DC may it take in-DC sources over cap instead. So the walk stops at the first tier with a healthy
        source under the cap and hands over that tier's ones under the cap (and, for another DC, every
        healthy source walked). With none under the cap anywhere it hands over every healthy source;
        with no healthy one (or `source_hosts` set) the full candidate list, as `_candidates` has it."""
        idx = self._index
        places = idx.places.get((model, ver, shard))
        planner = self.policy(model).planner
        if places and not planner.cfg.source_hosts:
            now, wid, loc = self.clock(), reader.id, reader.location
            cap = max(1, planner.cfg.fanout_cap)
            down = self._downstream(wid, model, ver, shard, exclude_fetch)
            hk, rk, dk = place_keys(loc)
            suspects = self.suspects
            over: list[Source] = []
            walked: dict = {}  # the nearer tier's replica ids (places nest: host in rack in DC)
            for tier, rids in enumerate((places.get(hk, ()), places.get(rk, ()), places.get(dk, ()),
                                         idx.shard_replicas.get((model, ver, shard), ()))):
                under: list[Source] = []
                for rid in rids:
                    if rid in walked:
                        continue
                    r = self.replicas[rid]
                    w = self.workers.get(r.worker)
                    if (w is None or r.worker == wid or r.worker in down or r.releasing
                            or (suspects and suspects.get(rid, 0) > now)):
                        continue
                    load = idx.load.get(r.worker, 0)
                    (under if load < cap else over).append(
                        Source(rid, r.worker, w.location, r.full, load, r.origin, r.slot == "seed"))
                if under:
                    return under if tier < CROSS_DC else under + over
                walked = rids
            if over:
                return over
        return self._sources(self._candidates(reader.id, model, ver, shard, exclude_fetch=exclude_fetch))

    def _sources(self, cands: list[ReplicaRec]) -> list[Source]:
        """The planner's view of candidate replicas; an offload seed is a backup (planner rule 5)."""
        return [Source(r.id, r.worker, self.workers[r.worker].location, r.full, self.worker_load(r.worker), r.origin,
                       backup=r.slot == "seed") for r in cands]

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
        down, frontier = set(), {ReplicaId(wid, model, ver, shard).wire}
        readers_of = self._index.readers_of
        while frontier:
            nxt = set()
            for fid in {fid for rid in frontier for fid in readers_of.get(rid, ())}:
                f = self.fetches[fid]
                if f.id != exclude_fetch and f.model == model and f.version == ver and f.shard == shard \
                        and f.reader not in down:
                    down.add(f.reader)
                    nxt.add(f.relay)
            frontier = nxt
        return down

    def replan(self, wid: str, fid: str, failed: list[str], units: list[int], gone=()) -> Plan:
        """A reader's sources `failed` (dead or stalled): mark them suspect, plan `units` elsewhere.

        `gone`: those of `failed` whose data port refused the reader (nobody listens there: the worker
        died). Their workers are dropped now, as an expiry would drop them a worker_timeout_s later; one
        that is alive after all re-joins at its next heartbeat and re-registers what it holds."""
        reader = self.touch(wid)
        f = self.fetches.get(fid)
        if f is None or f.reader != wid:
            raise E.UnknownFetchError(f"unknown fetch {fid!r} for worker {wid}")
        manifest = self.models[f.model].versions[f.version].manifests[f.shard]
        if any(not isinstance(u, int) or not 0 <= u < len(manifest.units) for u in units):
            raise E.ProtocolError("replan: unit ids out of range")
        dead = sorted({r.worker for rid in gone if rid in failed and (r := self.replicas.get(rid)) is not None
                       and r.worker != wid and r.worker in self.workers})
        for w in dead:
            log.warning("worker %s (%s) dropped: its data port refused reader %s (the process is gone)",
                        w, self.workers[w].name, wid)
            self.remove_worker(w)
        now = self.clock()
        for rid in failed:
            if rid in self.replicas and rid not in f.failed_at:
                self.suspects[rid] = now + self.cfg.suspect_s
                log.warning("fetch %s: source %s reported failed; suspect for %.0fs", fid, rid, self.cfg.suspect_s)
            f.sources.pop(rid, None)
            f.excluded.add(rid)
            f.failed_at.setdefault(rid, now)  # a parked replan asks again with the same report
        cands = (self._candidates(wid, f.model, f.version, f.shard, exclude_fetch=fid, excluded=f.excluded)
                 # Every other holder failed this fetch once. A failure may have passed (a stall, a relay
                 # whose upstream died, a restart): a live holder that did not fail just now gets another try.
                 or self._candidates(wid, f.model, f.version, f.shard, exclude_fetch=fid, excluded=set(failed)))
        if not cands:
            # Only the sources that just failed hold it. A dead one is expired within worker_timeout_s;
            # a stalled one (a loaded machine, a long GC) is heard from again: offer it again then.
            alive = [r for rid in failed if (r := self.replicas.get(rid)) is not None and r.worker in self.workers
                     and r.worker != wid]
            cands = [r for r in alive if self.workers[r.worker].last_seen > f.failed_at[r.id]]
            if not cands and alive:
                raise HolderSilentError(f"{f.model!r} v{f.version} {f.shard}: every holder failed this fetch and "
                                        "has not been heard from since; waiting for one (or its expiry)")
            for r in cands:
                f.failed_at.pop(r.id)
        if not cands:
            raise E.VersionLostError(f"{f.model!r} v{f.version} {f.shard}: no replica other than the ones that "
                                     f"failed this fetch can serve its {len(units)} missing units")
        srcs = self._sources(cands)
        sub = self.policy(f.model).planner.choose_sources(reader.location, srcs, [manifest.units[u].nbytes for u in units],
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
        if ok and not f.relay:
            raise E.ProtocolError(f"fetch {fid!r} was planned as a partial read (relay=false): it cannot end as a "
                                  "full replica; end it with ok=false")
        del self.fetches[fid]
        if not f.relay:
            return
        if ok:
            r = self.replicas[f.relay]
            r.full = True
            self._release_events.shard(r.model, r.version, r.shard)
        else:
            self.replicas.pop(f.relay, None)


def check_into_spec(manifest: Manifest, spec: list) -> None:
    """`spec` is [[name, dtype, shape], ...] of the reader's buffers; must match the manifest exactly
    (`check_buffers`; where they live and their contiguity the reader checked)."""
    try:
        have = [BufferSpec(str(n), str(d), tuple(int(x) for x in shp)) for n, d, shp in spec]
    except (TypeError, ValueError):
        raise E.ProtocolError("malformed into spec") from None
    check_buffers(manifest.tensors, have)
