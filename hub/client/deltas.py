"""HubClient's delta protocol: publish a version's delta from the previous one, and fetch a version
as a chain of deltas onto the version a reader holds — bit-exact or a typed failure, never torn.

The client's delta part: it holds the session, the replica book, the fetch and publish parts it
builds on, the publisher's copy of the last version it encoded from and a reader's decode buffers;
the `HubClient` facade (hub/client/__init__.py) delegates to it.

    hub.publish("policy", 8, params)
    hub.publish_delta("policy", 8, params)      # encode v8 against this client's copy of v7; publish it
    got = hub.fetch_delta("policy", "latest", into=params)   # reader holding v7 in `params`
    got.mode                                     # 'delta' | 'full' | 'held' (the hub chose)

Publisher side: the client keeps a host copy of the last version it encoded from (one model copy),
encodes per unit (hub/delta/codec.py) and publishes the frames as version v of `NAME@delta`
(hub/delta/plan.py), which it then holds and serves like any replica; it releases its deltas older
than the newest `keep`. Reader side: the hub says full or delta (`delta_choose`); a delta chain is
fetched like any version (relays, re-plans, fan-out: the reader then serves those deltas on), decoded
into scratch buffers and checked against v's unit checksums; only then is the held version released
and `into` overwritten and registered as a full replica of v. Any failure before that raises and
leaves `into` holding the old version, still registered (docs/deltas.md).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import torch

from rlsync.hub.delta import codec as D
from rlsync.hub import errors as E
from rlsync.hub.client.config import ClientConfig
from rlsync.hub.client.fetch import Fetcher, FetchResult
from rlsync.hub.client.publish import Publisher
from rlsync.hub.client.replicas import Replicas
from rlsync.hub.client.session import Session
from rlsync.hub.dataplane import device
from rlsync.hub.delta.plan import delta_base, expand_plan, from_compact_wire, tensor_name
from rlsync.hub.model.names import delta_model
from rlsync.hub.model.manifest import Manifest, Unit, allocate, build_manifest, byte_view, dtype_from_name, dtype_name, wire_digest
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.protocol.rpc import pack
from rlsync.hub.model.shard import Shard
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.args import check_coords as _check_coords
from rlsync.hub.protocol.messages import FetchPlan

log = logging.getLogger("rlsync.hub.client")


@dataclass(slots=True)
class _Snapshot:
    version: int
    manifest: Manifest
    tensors: dict[str, torch.Tensor]
    views: list[memoryview]


class Deltas:
    """publish_delta (the publisher encodes) and fetch_delta (the hub chooses full or a delta chain)."""

    def __init__(self, session: Session, replicas: Replicas, fetcher: Fetcher, publisher: Publisher,
                 cfg: ClientConfig) -> None:
        self.session, self.replicas, self.fetcher, self.publisher, self.cfg = session, replicas, fetcher, publisher, cfg
        self.snap: dict = {}
        """(model, shard key) -> the publisher's copy of its last version (`_Snapshot`)."""
        self.scratch: dict = {}
        """(model, shard key) -> a reader's decode buffer, reused."""

    def publish_delta(self, model: str, version: int, tensors: dict[str, torch.Tensor], shard: Shard = Shard(),
                      keep: int = 4) -> dict:
        """Publish v's delta from the last version this client encoded from, then keep a copy of v.

        Call before the tensors change, before or after `publish(model, version, tensors, shard)`:
        before (the order `rlsync.workers` use) v's delta is committed by the time v is, so a reader
        that sees v finds its delta. The first call (or one after a layout change) publishes nothing
        and only takes the copy. Returns {"base", "delta_bytes", "full_bytes", "encode_s", "copy_s"}
        (base None: no delta published)."""
        wid = self.session.need_join()
        _check_coords("publish", model, version, shard)
        device.check_tensors(tensors, "tensors")
        _check_keep("publish_delta", keep)
        snap = self.snap.get((model, shard.key))
        if snap is not None and version <= snap.version:
            raise E.VersionError(f"publish_delta: {model!r} v{version} is not after v{snap.version}, the last "
                                 "version this client encoded from (versions only grow)")
        rep = self.replicas.store.get(ReplicaId(wid, model, version, shard.key).wire)
        if rep is not None and rep.complete:
            if [rep.tensors[s.name].data_ptr() for s in rep.manifest.tensors] != \
                    [tensors[s.name].data_ptr() if s.name in tensors else -1 for s in rep.manifest.tensors]:
                raise E.BufferMismatchError("publish_delta: `tensors` are not the ones published as this version")
            man, views = rep.manifest, rep.views
        else:  # not published yet: v's manifest as `publish` will build it (the client's manifest config)
            man = build_manifest(tensors, self.cfg.manifest)
            views = [byte_view(tensors[s.name]) for s in man.tensors]
        key = (model, shard.key)
        out = {"base": None, "delta_bytes": 0, "full_bytes": man.nbytes, "encode_s": 0.0, "copy_s": 0.0}
        if snap is not None and snap.version < version and snap.manifest.layout_key() == man.layout_key():
            t0 = time.monotonic()
            frames = D.encode(snap.manifest, snap.views, man, views)
            dts = {tensor_name(snap.version, i): torch.frombuffer(bytearray(f), dtype=torch.uint8)
                   for i, f in enumerate(frames)}
            out["encode_s"] = time.monotonic() - t0
            # Frames are small and get packed (up to ManifestConfig.pack_bytes) like tiny tensors. Packing
            # only up to one chunk (to pipeline through relays) was measured worse here: docs/deltas.md.
            self.publisher.publish(delta_model(model), version, dts, shard)
            out.update(base=snap.version, delta_bytes=sum(len(f) for f in frames))
            self._drop_old_deltas(model, shard, self._old_deltas(model, shard, version, keep))
        t0 = time.monotonic()
        if snap is None or snap.manifest.layout_key() != man.layout_key():
            copy = {s.name: torch.empty_like(tensors[s.name]) for s in man.tensors}
            snap = _Snapshot(version, man, copy, [byte_view(copy[s.name]) for s in man.tensors])
            self.snap[key] = snap
        for i, s in enumerate(man.tensors):
            if s.nbytes:
                snap.views[i][:] = views[i]
        snap.version, snap.manifest = version, man
        out["copy_s"] = time.monotonic() - t0
        return out

    def publish_fetched_delta(self, model: str, version: int, delta: dict[str, torch.Tensor], shard: Shard = Shard(),
                              keep: int = 4) -> int:
        """Publish a delta object fetched from another hub (`FetchResult.deltas[version]`, frames as the
        publisher encoded them) as v's delta on this hub: a federation gateway's `publish_delta`, with
        no copy of the model and no encoding (the hub refuses anything but base<v>.u<i> frames:
        ManifestMismatchError). Publish it before v, as `publish_delta`. Returns its bytes."""
        self.session.need_join()
        device.check_tensors(delta, "delta")
        _check_keep("publish_fetched_delta", keep)
        self.publisher.publish(delta_model(model), version, delta, shard)
        self._drop_old_deltas(model, shard, self._old_deltas(model, shard, version, keep))
        return sum(t.nbytes for t in delta.values())

    def fetch_delta(self, model: str, version: int | str = "latest", into: dict[str, torch.Tensor] | None = None,
                    shard: Shard = Shard(), keep: int = 2, fallback: bool = False,
                    keep_base: bool = False) -> FetchResult:
        """Bring `into` (which holds an older version of `model`, fetched or published there) to
        `version`, by a chain of deltas when the hub says that is cheaper, else in full.

        Bit-exact: every unit of the result is checked against v's manifest before `into` changes.
        A failure of the delta path raises (DeltaError, TransferError, VersionLostError ...) with
        `into` still holding, and serving, the old version; with `fallback=True` it fetches v in full
        instead. The result's `mode` says which path ran; `nbytes` is the bytes that moved.
        `keep_base`: `into` is never written (it still serves the old version, e.g. a federation
        gateway's copy in its DC); v arrives in new buffers (`result.tensors`), and `result.deltas`
        holds the chain's delta objects {version: tensors} (the gateway publishes them in its DC)."""
        wid = self.session.need_join()
        _check_coords("fetch", model, version, shard)
        _check_keep("fetch_delta", keep)
        if into is None:
            return self.fetcher.fetch(model, version, shard=shard)
        device.check_tensors(into, "into")
        self.replicas.check_destination(into)
        dest = None if keep_base else into  # where a full fetch lands
        base = self._held_in(model, shard, into)
        if base is None or any(t.device.type != "cpu" for t in into.values()):
            return self.fetcher.fetch(model, version, into=dest, shard=shard)
        t0 = time.monotonic()
        ph, mark = {}, [t0]

        def lap(name: str) -> None:
            now = time.monotonic()
            ph[name], mark[0] = round(now - mark[0], 4), now

        spec = [[n, dtype_name(t.dtype), list(t.shape)] for n, t in into.items()]
        ch = self.session.call("delta_choose", wid=wid, model=model, version=version, shard=shard.to_wire(),
                        base=base.version, into_spec=spec)
        if ch["mode"] != "delta":
            r = self.fetcher.fetch(model, ch["version"], into=dest, shard=shard)
            r.mode = "held" if ch["mode"] == "held" else "full"
            return r
        lap("choose")
        done: list = []  # the chain's fetches, told finished with v's registration (one round trip)
        try:
            frames, per_source, used, moved, deltas = self._pull_chain(model, shard, base.version, ch["chain"],
                                                                       ch.get("plan"), done)
            lap("pull")
            manifest = _target_manifest(base.rep.manifest, frames[-1], ch["manifest_digest"])
            result = self._decode_chain(base.rep, manifest, frames, (model, shard.key))
            lap("decode")
        except E.HubError as e:
            self._tell_done(done)  # the deltas that did arrive are whole and verified: they serve on
            if not fallback:
                raise
            log.warning("delta fetch of %s v%d failed (%s): fetching it in full", model, ch["version"], e)
            r = self.fetcher.fetch(model, ch["version"], into=dest, shard=shard)
            r.mode = "full"
            return r
        except BaseException:
            self._tell_done(done)
            raise
        if keep_base:  # v verified in its own buffers (not the scratch cache's any more); `into` untouched
            left = self._register_applied(model, ch["version"], shard, manifest, result, done=done,
                                          digest=ch["manifest_digest"], drop=self._old_deltas(model, shard, ch["chain"][-1], keep))
            lap("register")
            r = FetchResult(ch["version"], result, per_source, used, time.monotonic() - t0, moved, manifest)
            r.mode, r.phases, r.deltas = "delta", ph, deltas
            self._drop_old_deltas(model, shard, left)
            self.fetcher.notify(r)
            return r
        # -- every unit of v verified in scratch: now (and only now) the old version in `into` goes
        try:
            self.fetcher.release_overlapping(into)
        except BaseException:
            self._tell_done(done)
            raise
        lap("release")
        for s in manifest.tensors:  # a memcpy per tensor (torch's copy_ is ~40x slower on a loaded 2-core box)
            if s.nbytes:
                byte_view(into[s.name])[:] = byte_view(result[s.name])
        lap("apply")
        self.scratch[(model, shard.key)] = result  # the next delta decodes into warm pages
        left = self._register_applied(model, ch["version"], shard, manifest, into, done=done, digest=ch["manifest_digest"],
                                      drop=self._old_deltas(model, shard, ch["chain"][-1], keep))
        lap("register")
        r = FetchResult(ch["version"], into, per_source, used, time.monotonic() - t0, moved, manifest)
        r.mode, r.phases = "delta", ph
        self._drop_old_deltas(model, shard, left)  # after the clock: the caller has v
        self.fetcher.notify(r)
        return r

    # ------------------------------------------------------------------ helpers
    def _held_in(self, model: str, shard: Shard, into: dict[str, torch.Tensor]):
        """The version of `model` held in exactly the `into` buffers, if any: a full replica of this
        client, or the private copy a fetch of a version already held made there (`_copies`), if its
        bytes are still that version's (checked: the caller may have written them since)."""
        for rid, (m, v, s, slot) in list(self.replicas.held.items()):
            rep = self.replicas.store.get(rid)
            if m != model or s.key != shard.key or slot != "live" or rep is None or not rep.complete:
                continue
            if set(rep.tensors) == set(into) and all(rep.tensors[n].data_ptr() == into[n].data_ptr() for n in into):
                return _Held(v, rep)
        copy = self.replicas.copies.pop((model, shard.key), None)
        if copy is not None and copy[2] == {n: t.data_ptr() for n, t in into.items()} and not copy[1].verify(into):
            return _Held(copy[0], LocalReplica(f"copy:{model}:{copy[0]}", copy[1], dict(into), full=True))
        return None

    def _pull_chain(self, model: str, shard: Shard, base: int, chain: list[int], plan: dict | None = None,
                    done: list | None = None):
        """Fetch the chain's deltas, all at once (this worker then holds and serves them); their frames in
        order (and {version: the delta's tensors}). `plan`: the first delta's plan, sent with the hub's choice (its manifest in compact form)."""
        if plan is not None:
            try:
                plan = FetchPlan.from_wire(
                    expand_plan({k: v for k, v in plan.items() if k != "compact_manifest"}, model, chain[0], shard)
                    | {"manifest": from_compact_wire(plan.get("compact_manifest") or {})})
            except E.HubError:
                self.fetcher.fetch_done(str(plan.get("fetch_id")), ok=False)  # the hub closes the plan it made
                raise
        got: dict[int, FetchResult | BaseException] = {}

        def pull(dv: int) -> None:
            try:
                got[dv] = self.fetcher.fetch_once(delta_model(model), dv, None, shard, _plan=plan if dv == chain[0] else None,
                                      _done_later=done)
            except BaseException as e:  # noqa: BLE001 - raised below, after every pull ended
                got[dv] = e

        threads = [threading.Thread(target=pull, args=(dv,), daemon=True) for dv in chain[1:]]
        for t in threads:
            t.start()
        pull(chain[0])
        for t in threads:
            t.join()
        errors = [r for r in got.values() if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        frames, per_source, used, moved = [], {}, {}, 0
        deltas = {dv: got[dv].tensors for dv in chain}
        for dv in chain:
            r = got[dv]
            if delta_base(r.manifest) != base:
                raise E.DeltaError(f"delta v{dv} of {model!r} is from v{delta_base(r.manifest)}, not v{base}")
            n = len(r.manifest.tensors)
            frames.append([byte_view(r.tensors[tensor_name(base, i)]) for i in range(n)])
            for w, b in r.bytes_by_source.items():
                per_source[w] = per_source.get(w, 0) + b
            used.update(r.transports)
            moved += sum(r.bytes_by_source.values())
            base = dv
        return frames, per_source, used, moved, deltas

    def _decode_chain(self, base: LocalReplica, manifest: Manifest, frames: list, key: tuple) -> dict[str, torch.Tensor]:
        """Decode the chain into a scratch buffer (never the base's; the last one of this model and
        shard, taken from the cache while in use, if it fits); v's bytes, every unit verified."""
        if base.manifest.layout_key() != manifest.layout_key():
            raise E.DeltaError("the held version's layout differs from the target's: no delta applies")
        buf = self.scratch.pop(key, None)
        if buf is None or [(n, t.dtype, tuple(t.shape)) for n, t in buf.items()] != \
                [(s.name, dtype_from_name(s.dtype), s.shape) for s in manifest.tensors]:
            buf = allocate(manifest)
        D.decode_chain(manifest, base.views, frames, [byte_view(buf[s.name]) for s in manifest.tensors])
        return buf

    def adopt(self, model: str, version: int, tensors: dict[str, torch.Tensor], shard: Shard = Shard()) -> None:
        """Register `tensors`, left holding `version` of `model` by an earlier session of this worker
        (e.g. it left and re-joined as a new client), as a live replica again: served to others, and a
        base `fetch_delta` can build on. Their checksums are computed here (the client's manifest
        config); the hub accepts them only as exactly v's (ManifestMismatchError otherwise; also
        VersionNotFoundError: v forgotten) and then nothing is registered. Host tensors only."""
        self.session.need_join()
        _check_coords("register", model, version, shard)
        device.check_tensors(tensors, "tensors")
        if any(t.device.type != "cpu" for t in tensors.values()):
            raise E.BufferMismatchError("adopt: host tensors only")
        man = build_manifest(tensors, self.cfg.manifest)
        rid = ReplicaId(self.session.worker_id, model, version, shard.key).wire
        rep = self.replicas.store.get(rid) if rid in self.replicas.held else None
        if rep is not None:  # held here already: answered here, and the held replica is left as it is
            if rep.manifest != man:
                raise E.ManifestMismatchError(f"adopt: these bytes are not {model!r} v{version} {shard.key}'s "
                                              "(this worker holds that version: its manifest differs)")
            if all(rep.tensors[n].data_ptr() == t.data_ptr() for n, t in tensors.items()) and set(rep.tensors) == set(tensors):
                return
            raise E.BufferMismatchError(f"adopt: this worker already holds {model!r} v{version} {shard.key} in "
                                        "other buffers; release it first")
        # Registered first (the hub checks the bytes are v's): a refusal leaves every replica here as it was.
        self._register_applied(model, version, shard, man, dict(tensors), raise_errors=True)
        self.fetcher.release_overlapping(tensors, keep=rid)  # these buffers stop being whatever else they were

    def _register_applied(self, model: str, ver: int, shard: Shard, manifest: Manifest,
                          into: dict[str, torch.Tensor], raise_errors: bool = False, done: list | None = None,
                          digest: str | None = None, drop: list[int] = ()) -> list[int]:
        """Register v, held in `into`. With `digest` (v's manifest digest from `delta_choose`, which this
        manifest was checked against) in one `applied` call that also tells the fetches `done` finished
        and releases the old delta objects `drop` (versions) that nothing reads or needs any more; the
        manifest itself and each fetch's end otherwise (and whenever `applied` fails). Returns the
        versions of `drop` still held: the caller releases them the usual way (`_drop_old_deltas`)."""
        rid = ReplicaId(self.session.worker_id, model, ver, shard.key).wire
        self.replicas.store.add(LocalReplica(rid, manifest, into, full=True))
        self.replicas.hold(rid, model, ver, shard, "live")
        left = list(drop)
        try:
            if digest is not None:
                unknown, released = self.session.call("applied", wid=self.session.worker_id, model=model, version=ver,
                                               shard=shard.to_wire(), manifest_digest=digest,
                                               done=[d[0] for d in done or ()], release_deltas=left)
                done = [d for d in done or () if d[0] in set(unknown)]  # the hub forgot them: tell below
                for dv in released:  # the hub routes no read to them and none is in flight: drop them here
                    self.publisher.released(ReplicaId(self.session.worker_id, delta_model(model), dv, shard.key).wire)
                left = [dv for dv in left if dv not in set(released)]
            else:
                self.session.call("register", wid=self.session.worker_id, model=model, version=ver, shard=shard.to_wire(),
                           slot="live", manifest=manifest.to_wire())
        except E.HubError as e:  # e.g. forgotten meanwhile: the bytes are v's, but nobody is routed here
            self.replicas.held.pop(rid, None)
            self.replicas.store.remove(rid)
            if raise_errors:
                raise
            log.warning("applied %s v%d by delta but could not register it: %s", model, ver, e)
        finally:
            self._tell_done(done)
        return left

    def _tell_done(self, done: list | None) -> None:
        """Tell the hub each fetch in `done` ended well (the deferred `fetch_done`s), and forget them."""
        while done:
            fid, rep, model, ver, shard = done.pop()
            self.fetcher.fetch_done(fid, ok=True, rep=rep, model=model, version=ver, shard=shard)

    def _old_deltas(self, model: str, shard: Shard, newest: int, keep: int) -> list[int]:
        """Versions of the delta objects of (model, shard) held here that are older than the newest
        `keep` (at least 1) up to `newest`."""
        dm = delta_model(model)
        return sorted(v for m, v, s, slot in list(self.replicas.held.values())
                      if m == dm and s.key == shard.key and slot == "live" and v <= newest - max(1, keep))

    def _drop_old_deltas(self, model: str, shard: Shard, versions: list[int]) -> None:
        dm = delta_model(model)
        for v in versions:
            try:
                self.publisher.release(dm, v, shard)
            except E.HubError as e:
                log.warning("releasing old delta %s v%d: %s", dm, v, e)


def _check_keep(op: str, keep) -> None:
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise E.InvalidArgumentError(f"{op}: keep must be an int >= 1 (delta objects kept), got {keep!r}")


def _target_manifest(held: Manifest, last: list, digest: str) -> Manifest:
    """v's manifest: the held version's layout with the unit checksums the last delta's frames aim at,
    accepted only if it is the manifest the hub named (`digest`): the hub need not send it."""
    if len(last) != len(held.units):
        raise E.DeltaError(f"the delta has {len(last)} frames; the held version has {len(held.units)} units")
    units = tuple(Unit(u.segments, u.nbytes, D.frame_info(f)[4]) for u, f in zip(held.units, last))
    m = Manifest(held.tensors, units, held.nbytes)
    if wire_digest(pack(m.to_wire())) != digest:
        raise E.DeltaError("the delta's target is not the version the hub chose (manifest digest differs)")
    return m


@dataclass(slots=True)
class _Held:
    version: int
    rep: LocalReplica
