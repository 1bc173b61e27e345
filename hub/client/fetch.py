"""The client's fetch part: ask the hub for a plan, serve the fetch as a relay at once, pull every
source's units in parallel over the data plane (verified per unit), re-plan around failed sources,
and tell the hub the outcome.

It holds the session (control calls, identity, endpoint), the replica book, the manifests the hub
sent, and the publisher (to release a replica whose buffers a fetch is about to overwrite); the
`HubClient` facade (hub/client/__init__.py) delegates to it and re-exports `FetchResult`.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from rlsync.hub import errors as E
from rlsync.hub.client.config import ClientConfig
from rlsync.hub.client.manifests import ManifestCache
from rlsync.hub.client.publish import Publisher
from rlsync.hub.client.replicas import Replicas, buffers, overlaps
from rlsync.hub.client.session import Session
from rlsync.hub.dataplane.transfer import read_from_source
from rlsync.hub.model.manifest import Manifest, allocate, dtype_name
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.shard import Shard
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.dataplane.tuning import choose_path
from rlsync.hub.dataplane import device
from rlsync.hub.protocol.args import check_coords as _check_coords, check_value
from rlsync.hub.protocol.messages import FetchPlan, Source

log = logging.getLogger("rlsync.hub.client")  # one logger for the whole client (log set-up names it)


@dataclass(slots=True)
class FetchResult:
    version: int
    """The version fetched (resolved from 'latest' or a reader group's pin)."""
    tensors: dict[str, torch.Tensor]
    """The fetched tensors (the `into` buffers when given)."""
    bytes_by_source: dict[str, int]
    """Worker id -> bytes it served to this fetch."""
    transports: dict[str, str]
    """Worker id -> transport used."""
    seconds: float
    nbytes: int
    manifest: Manifest | None = None
    """The version's manifest (tensor list, units, unit checksums): lets a consumer re-check bytes."""
    mode: str = "full"
    """How it arrived: 'full' (units of the version), 'delta' (a chain of deltas onto the held
    version: `nbytes` is then the delta bytes that moved), 'held' (nothing moved)."""
    phases: dict | None = None
    """For a delta fetch, seconds per phase: choose, pull, decode, release, apply, register."""
    deltas: dict | None = None
    """For `fetch_delta(keep_base=True)` by delta: {delta version: the delta object's tensors} of the chain."""

    @property
    def gbps(self) -> float:
        return self.nbytes * 8 / 1e9 / self.seconds if self.seconds > 0 else 0.0


class Fetcher:
    """Fetch (plan, pull, re-plan, finish), already-held fetches, buffer overlap releases."""

    def __init__(self, session: Session, replicas: Replicas, publisher: Publisher, cfg: ClientConfig,
                 notify: Callable[[FetchResult], None]) -> None:
        self.session, self.replicas, self.publisher, self.cfg = session, replicas, publisher, cfg
        self.notify = notify
        """Called with every completed fetch's result, after the replica is held (`HubClient(on_fetch=)`)."""
        self.manifests = ManifestCache()
        """Manifests this client was sent in fetch plans: a fetch says it has them, the hub omits them."""
        self.pull_fault: Callable | None = None
        """Fault injection on the data plane (`HubClient.set_pull_fault`)."""

    def fetch(self, model: str, version: int | str = "latest", into: dict[str, torch.Tensor] | None = None,
              shard: Shard = Shard(), group: tuple[str, int] | None = None,
              on_unit: Callable[[Manifest, int], None] | None = None) -> FetchResult:
        """Pull (model, version, shard) from peers per the hub's plan; verify every unit.

        `version` is 'latest' or a committed version number. 'latest' is the newest committed version
        some live worker can serve now (`result.version` says which): when every holder of the newest
        one died, the newest older one that is still held; and when the version a 'latest' fetch was
        planned for is lost while it is being read, the fetch is planned again for what 'latest' is then.
        `group=(name, size)` pins a reader group
        (e.g. the TP ranks of one inference engine) to one version across its members. Afterwards
        this worker is a full replica and serves the version to others until it releases it.
        `on_unit(manifest, u)` is called from transfer threads once unit `u` has landed and verified
        (to consume tensors while the rest still arrive); a fetch of a version already held calls it
        for no unit.
        """
        for attempt in range(3):
            try:
                return self.fetch_once(model, version, into, shard, group, on_unit)
            except E.VersionLostError as e:
                if not getattr(e, "after_plan", False) or version != "latest" or group is not None or attempt == 2:
                    raise
                log.warning("fetch of %r latest: the version it was planned for was lost (%s); planning again", model, e)
        raise AssertionError("unreachable")

    def fetch_once(self, model: str, version: int | str, into: dict[str, torch.Tensor] | None, shard: Shard,
               group: tuple[str, int] | None = None, on_unit=None, _plan: FetchPlan | None = None,
               _done_later: list | None = None) -> FetchResult:
        """One fetch, as `fetch` describes (no re-planning of a lost 'latest'). `_plan`: a plan the hub
        already sent (with its manifest), from `delta_choose`. `_done_later`: the fetch's successful end
        is not told now but appended here as (fetch id, replica, model, version, shard), for the caller
        to tell with its next call (`fetch_delta`: with the registration of the version it applied,
        `applied`) or by `_fetch_done`."""
        wid = self.session.need_join()
        _check_coords("fetch", model, version, shard)
        if group is not None:
            check_value("fetch", "group", group)
        spec = None
        if into is not None:
            device.check_tensors(into, "into")
            self.replicas.check_destination(into)
            spec = [[n, dtype_name(t.dtype), list(t.shape)] for n, t in into.items()]
        t0 = time.monotonic()
        have = self.manifests.have(model, shard) if _plan is None else {}  # the hub leaves these out
        plan = _plan or FetchPlan.from_wire(self.session.call(
            "fetch", wid=wid, model=model, version=version, shard=shard.to_wire(), group=list(group) if group else None,
            into_spec=spec, have_manifests=list(have)))
        fid, ver = plan.fetch_id, plan.version
        if plan.held:
            got = self._already_held(model, ver, shard, into, t0)
            if got is not None:
                return got
            have = self.manifests.have(model, shard)
            plan = FetchPlan.from_wire(self.session.call("fetch", wid=wid, model=model, version=ver, shard=shard.to_wire(),
                                                  group=list(group) if group else None, into_spec=spec,
                                                  have_manifests=list(have)))
            fid = plan.fetch_id
            if plan.held:
                raise E.ProtocolError(f"the hub still lists {model!r} v{ver} {shard.key} as held here")
        rid = ReplicaId(wid, model, ver, shard.key).wire
        if rid in self.replicas.held and self.replicas.store.get(rid) is not None:
            # The hub planned a transfer of a version this worker holds in full: it lost our record of
            # it (a re-join raced the end of the fetch that got it). Never fetch over it: drop the plan,
            # register the replica again, and answer from it as for any version already held.
            self.fetch_done(fid, ok=False)
            self.publisher.reregister(rid)
            got = self._already_held(model, ver, shard, into, t0)
            if got is not None:
                return got
            raise E.ProtocolError(f"{model!r} v{ver} {shard.key} is held here but cannot be served from here")
        try:
            manifest = self.manifests.take(plan, have, model, shard)
            if into is not None:
                device.check_into(manifest, into)
            dest_tensors = dict(into) if into is not None else allocate(manifest)
            dest = device.make_replica(rid, manifest, dest_tensors, full=False)
            # The hub already advertises this relay: serve it at once (no unit is present yet, so
            # its readers wait on the condition variable), then release whatever version these
            # buffers held before writing into them (the mutability contract).
            self.replicas.store.add(dest)
            if into is not None:
                self.release_overlapping(into)
        except BaseException as e:
            if self.replicas.store.get(rid) is not None:
                self.replicas.store.get(rid).fail(f"fetch refused: {e}")  # readers planned on the relay stop waiting
            self.replicas.store.remove(rid)
            self.fetch_done(fid, ok=False)
            raise
        per_source: dict[str, int] = {}
        used: dict[str, str] = {}
        sources, attempts = plan.sources, 0
        try:
            while True:
                failed, errors = self.pull_all(sources, dest, per_source, used, on_unit)
                missing = [u for u in range(len(manifest.units)) if not dest.present[u]]
                if not missing:
                    break
                fatal = [e for e in errors if not isinstance(e, (E.TransferError, E.TicketError, E.ProtocolError))]
                attempts += 1
                if fatal or attempts > self.cfg.replan_attempts or not failed:
                    self._abort_fetch(dest, fid, errors[0] if errors else
                                      E.ProtocolError("fetch plan did not cover every unit"))
                log.warning("fetch %s: %d sources failed (%s); re-planning %d units", fid, len(failed),
                            errors[0] if errors else "", len(missing))
                try:
                    try:
                        # Sources whose port refused us are dead (not stalled): the hub drops them at once.
                        gone = [r for r, e in zip(failed, errors) if isinstance(e, E.SourceGoneError)]
                        sources = Source.list_from_wire(self.session.call("replan", wid=wid, fetch_id=fid, failed=failed,
                                                                   units=missing, **({"gone": gone} if gone else {})))
                    except E.UnknownFetchError:
                        # The hub restarted (or expired us) since it planned this fetch: plan it anew. The
                        # units already here stay; only missing ones are pulled (from whoever holds them now).
                        plan = FetchPlan.from_wire(self.session.call(
                            "fetch", wid=wid, model=model, version=ver, shard=shard.to_wire(), group=None,
                            into_spec=spec, have_manifests=list(self.manifests.have(model, shard))))
                        if plan.held:
                            raise E.ProtocolError(f"the hub lists {model!r} v{ver} {shard.key} as held here "
                                                  "while this worker is still fetching it") from None
                        fid, sources = plan.fetch_id, plan.sources
                except E.HubError as e:
                    self._abort_fetch(dest, fid, e)
        except E.HubError:
            raise  # _abort_fetch already failed the relay and told the hub
        except Exception as e:  # a bug, not a peer: still fail the relay so its readers do not wait
            log.exception("fetch %s failed unexpectedly", fid)
            self._abort_fetch(dest, fid, e)
        self.replicas.hold(rid, model, ver, shard, "live")  # first: a re-join from now on registers it
        if _done_later is not None:
            _done_later.append((fid, dest, model, ver, shard))
        else:
            self.fetch_done(fid, ok=True, rep=dest, model=model, version=ver, shard=shard)
        secs = time.monotonic() - t0
        result = FetchResult(ver, dest_tensors, per_source, used, secs, manifest.nbytes, manifest)
        self.notify(result)
        return result

    def _already_held(self, model: str, ver: int, shard: Shard, into, t0: float) -> FetchResult | None:
        """This worker already holds (model, ver, shard): no transfer. Copy into `into` if it is
        other memory (that copy is private: it is not registered as a replica).

        Whatever replica lived in `into` before is released first, as for a transfer: those buffers
        are about to hold `ver`, so neither this client nor the hub may keep them as another version.
        Returns None if the hub's record is stale (we hold no such replica here): the caller re-plans.
        """
        rid = ReplicaId(self.session.worker_id, model, ver, shard.key).wire
        rep = self.replicas.store.get(rid)
        if rep is None or rid not in self.replicas.held:
            self._forget_stale(model, ver, shard)
            return None
        held = buffers(rep)
        if into is None:
            out = held
        else:
            same = all(t.data_ptr() == held[name].data_ptr() for name, t in into.items())
            if not same:
                if overlaps(held.values(), into.values()):
                    raise E.BufferMismatchError(f"into overlaps the buffers that hold {model!r} v{ver} "
                                                "without being them: pass those buffers or separate memory")
                self.release_overlapping(into)
                for name, t in into.items():
                    t.copy_(held[name])
                # not a replica (one per version per worker), but `fetch_delta` may start from it
                self.replicas.copies[(model, shard.key)] = (ver, rep.manifest, {n: t.data_ptr() for n, t in into.items()})
            out = dict(into)
        return FetchResult(ver, out, {}, {}, time.monotonic() - t0, 0, rep.manifest)

    def _forget_stale(self, model: str, version: int, shard: Shard) -> None:
        """The hub lists a replica as ours that this client does not hold: make the hub drop it."""
        log.warning("hub listed %s v%d %s as held here, but it is not: releasing the stale record",
                    model, version, shard.key)
        try:
            self.session.call("release", wid=self.session.worker_id, model=model, version=version,
                       shard=shard.to_wire(), slot="live")
        except E.NotAReplicaError:
            pass

    def pull_all(self, sources: list[Source], dest: LocalReplica, per_source: dict, used: dict, on_unit=None):
        """Pull every source's units in parallel; returns (failed replica ids, errors). Through the
        client's pull fault hook when one is set (`HubClient.set_pull_fault`)."""
        if self.pull_fault is not None:
            return self.pull_fault(sources, dest, lambda srcs: self._pull(srcs, dest, per_source, used, on_unit))
        return self._pull(sources, dest, per_source, used, on_unit)

    def _pull(self, sources: list[Source], dest: LocalReplica, per_source: dict, used: dict, on_unit=None):
        failed: list[str] = []
        errors: list[BaseException] = []
        report = threading.Lock()

        def pull(src: dict) -> None:
            units = [u for u in src.units if not dest.present[u]]
            lock = threading.Lock()
            per_source.setdefault(src.worker, 0)

            def landed(u: int) -> None:  # count units as they verify, so a failed source's part counts
                with lock:
                    per_source[src.worker] += dest.manifest.units[u].nbytes
                if on_unit is not None:
                    on_unit(dest.manifest, u)

            try:
                dp = self.cfg.dataplane
                transport, streams = choose_path(self.session.endpoint, src.endpoint, self.cfg.transport, dp.streams,
                                                 dp.zero_copy_send)
                used[src.worker] = transport.name
                read_from_source(transport, src.endpoint, src.ticket, src.replica, units, dest,
                                 dp.io_timeout_s, on_unit=landed, streams=streams, reader=self.session.reader_key)
            except BaseException as e:  # noqa: BLE001 - reported to the caller's thread
                with report:  # failed[i] is the source of errors[i]
                    failed.append(src.replica)
                    errors.append(e)

        threads = [threading.Thread(target=pull, args=(s,), daemon=True) for s in sources[1:]]
        for t in threads:
            t.start()
        if sources:
            pull(sources[0])
        for t in threads:
            t.join()
        return failed, errors

    def _abort_fetch(self, dest: LocalReplica, fid: str, err: BaseException):
        dest.fail(str(err))  # downstream readers of this relay stop waiting and re-plan
        self.replicas.store.remove(dest.id)
        self.fetch_done(fid, ok=False)
        # Downstream readers may still be reading units that were present. The caller may reuse
        # `into` at once (a retry): its bytes must not change under those reads (mutability contract).
        if not dest.wait_drained(self.cfg.dataplane.io_timeout_s):
            log.warning("aborted fetch %s: a downstream read did not finish within %.0fs", fid,
                        self.cfg.dataplane.io_timeout_s)
        err = err if isinstance(err, E.HubError) else E.TransferError(f"fetch failed: {err}")
        err.after_plan = True  # the version was resolved and planned: a 'latest' fetch may resolve it again
        raise err

    def fetch_done(self, fid: str, ok: bool, rep: LocalReplica | None = None, model: str = "",
                    version: int = 0, shard: Shard = Shard()) -> None:
        try:
            self.session.call("fetch_done", wid=self.session.worker_id, fetch_id=fid, ok=ok)
        except E.ProtocolError:
            if ok and rep is not None:
                # The hub restarted while we fetched (it forgot the fetch): announce the replica.
                try:
                    self.session.call("register", wid=self.session.worker_id, model=model, version=version,
                                   shard=shard.to_wire(), slot="live", manifest=rep.manifest.to_wire())
                except E.HubError as e:
                    log.warning("register after fetch %s failed: %s", fid, e)
        except E.HubError as e:
            log.warning("fetch_done(%s) failed: %s", fid, e)

    def release_overlapping(self, into: dict[str, torch.Tensor], keep: str | None = None) -> None:
        """Release every full live replica held here whose buffers share memory with `into` (but `keep`)."""
        for rid in self.replicas.live_overlapping(into, keep):
            self.publisher.release_replica(rid)
