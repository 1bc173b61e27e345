"""`HubClient`: what a trainer or rollout worker uses to publish, fetch and release weights.

    hub = HubClient(address, token=token)
    hub.join(Location(dc="dc0", host="node3"))
    hub.publish("policy", 7, dict(model.named_parameters()))   # registers live tensors, no copy
    hub.release("policy", 7)                                   # before the optimizer writes them
    got = hub.fetch("policy", "latest", into=params)           # pulls from peers, verifies units
    hub.leave()

Each client runs a data-plane server that serves the units of every replica it holds, including
fetches still in progress (relays). Tensors must be contiguous host tensors; names, shapes and
dtypes of `into` must match the version's manifest exactly.

Mutability contract: tensors you published, or fetched into, must not change until `release`
returns. `fetch(into=...)` releases any replica that lives in those same buffers first.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import errors as E
from .connection_watch import HubConnectionWatch
from .dataplane import DataPlaneConfig, DataServer, read_from_source
from .location import Location
from .manifest import Manifest, ManifestConfig, allocate, build_manifest, dtype_name
from .rpc import RpcChannel, read_token
from .shard import Shard
from .store import LocalReplica, ReplicaStore
from .tickets import ReaderKey, TicketVerifier
from .transports import available_transports, choose_transport
from .transports import cuda, rdma
from .transports.shm import boot_id
from .wire_args import check_coords as _check_coords, check_value

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class ClientConfig:
    manifest: ManifestConfig = field(default_factory=ManifestConfig)
    """How published tensors are cut into transfer units."""
    dataplane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    """This worker's data-plane server."""
    transport: str | None = None
    """Force one transport ('tcp-py', 'shm', ...) instead of the best usable per peer."""
    rpc_timeout_s: float = 10.0
    """Deadline of one try of a control RPC (retried with backoff while the hub is unreachable)."""
    hub_deadline_s: float = 60.0
    """How long calls keep retrying an unreachable hub (restart, failover) before HubUnavailableError."""
    replan_attempts: int = 4
    """How many times one fetch asks the hub for new sources after sources died or stalled."""
    heartbeat_s: float = 1.0
    """Heartbeat period; the hub expires a worker silent for its worker_timeout_s."""
    release_timeout_s: float | None = None
    """Deadline for a release (waiting for readers to drain); None waits as long as it takes."""


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

    @property
    def gbps(self) -> float:
        return self.nbytes * 8 / 1e9 / self.seconds if self.seconds > 0 else 0.0


def _check_tensors(tensors: dict, what: str) -> None:
    if not isinstance(tensors, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in tensors.items()):
        raise E.BufferMismatchError(f"{what} must be a dict of str -> torch.Tensor")
    cuda.check_tensors(tensors, what)  # host tensors; CUDA tensors where CUDA is usable


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _overlaps(xs, ys) -> bool:
    """Do any of tensors `xs` share bytes with any of tensors `ys`?"""
    spans = [_span(t) for t in ys if t.numel()]
    return any(a < e and s < b for t in xs if t.numel() for a, b in [_span(t)] for s, e in spans)


class HubClient:
    def __init__(self, address: str, token: str | None = None, *, token_file: str | None = None,
                 config: ClientConfig | None = None,
                 on_fetch: Callable[[FetchResult], None] | None = None) -> None:
        """`on_fetch`: called with every completed fetch's `FetchResult` (the caller's and the ones the
        client starts itself, e.g. a seed worker following `latest`), after the replica is held."""
        if token is None:
            token = read_token(token_file) if token_file is not None else os.environ.get("RLSYNC_HUB_TOKEN")
        if not token:
            raise E.AuthError("HubClient needs the hub's token (token=, token_file= or $RLSYNC_HUB_TOKEN)")
        if not isinstance(token, str) or not isinstance(config or ClientConfig(), ClientConfig):
            raise E.InvalidArgumentError("token must be a str and config a ClientConfig")
        self.address, self.cfg = address, config or ClientConfig()
        self.on_fetch = on_fetch
        self._token = token
        self._rpc = RpcChannel(address, token, self.cfg.rpc_timeout_s, self.cfg.hub_deadline_s)
        self.store = ReplicaStore()
        self._held: dict[str, tuple[str, int, Shard, str]] = {}
        self._data: DataServer | None = None
        self.worker_id: str | None = None
        self.location: Location | None = None
        self._endpoint: dict = {}
        self._hb_stop = threading.Event()
        self._hb: threading.Thread | None = None
        self._name, self._role, self._follow = "worker", "worker", False
        self._rejoin_lock = threading.Lock()
        self._joins = 0  # completed re-joins: a thread that saw NotJoined before the last one skips its own
        self._releasing: set[str] = set()
        """Replicas whose release is under way: a re-join does not re-register them (the release
        re-registers one itself if the new hub has not heard of it, so retention still decides)."""
        self._seeding: set[tuple] = set()
        self._reader_key = ReaderKey()  # proves to sources that this client is its tickets' reader

    # ------------------------------------------------------------------ membership
    def join(self, location: Location | None = None, name: str = "worker", *, role: str = "worker",
             follow: bool = False) -> str:
        """Join the hub and start serving. `role="seed"` makes this a seed worker: it takes hand-offs
        from leaving workers and, with `follow=True`, keeps a copy of every model's latest version."""
        if self.worker_id is not None:
            raise E.HubError("already joined; call leave() first")
        if location is not None and not isinstance(location, Location):
            raise E.InvalidArgumentError(f"location must be a Location, got {type(location).__name__}")
        self.location = location or Location()
        self._data = DataServer(self.store, self.cfg.dataplane)
        self._endpoint = {"tcp": self._data.address, "pid": os.getpid(), "boot_id": boot_id(),
                          "host": self.location.host, "transports": available_transports(),
                          "reader_key": self._reader_key.public_bytes,
                          **rdma.endpoint_info(), **cuda.endpoint_info()}
        try:
            r = self._rpc.call("join", name=name, location=self.location.to_wire(), endpoint=self._endpoint,
                               role=role, follow=follow)
        except Exception:
            self._data.close()
            self._data = None
            raise
        self.worker_id = r["wid"]
        self._name, self._role, self._follow = name, role, follow
        self._data.worker_id = self.worker_id
        self._data.verifier = TicketVerifier(r["ticket_key"])
        self._hb_stop.clear()
        self._hb = threading.Thread(target=self._heartbeat_loop, name="rlsync-heartbeat", daemon=True)
        self._hb.start()
        return self.worker_id

    def leave(self, deadline_s: float | None = 0.0) -> None:
        """Leave the hub: stop serving and drop every replica held here.

        With notice (`deadline_s` > 0, e.g. a spot preemption warning), retention runs first: each
        replica that is the last full copy of a retained version is handed off — to a reader already
        fetching it, or to a seed worker the hub picks — before this worker goes, within the
        deadline. Without notice (0) it just goes; a version only it held is then lost.
        """
        if self.worker_id is None:
            self._rpc.close()
            return
        if deadline_s:
            self._handoff_all(deadline_s)
        self._hb_stop.set()
        if self._hb is not None:
            self._hb.join(timeout=5)
        try:
            self._rpc.call("leave", attempt_s=2.0, deadline_s=min(5.0, self.cfg.hub_deadline_s), wid=self.worker_id)
        except E.HubError as e:
            log.warning("leave: %s", e)
        for rep in self.store.all():
            rep.fail("worker left")
            self.store.remove(rep.id)
        self._held.clear()
        if self._data is not None:
            self._data.close()
        self._data, self.worker_id = None, None
        self._rpc.close()

    def _handoff_all(self, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        for rid in list(self._held):
            if rid not in self._held or self._held[rid][3] == "seed":
                continue
            model, version, shard, slot = self._held[rid]
            try:
                outcome = self._release_loop(rid, handoff=True, deadline=end)
                if outcome == "seed":
                    log.error("leaving: no reader or seed worker can take %s v%d %s; it is lost when we go",
                              model, version, shard.key)
            except E.HubError as e:
                log.error("leaving: hand-off of %s v%d %s failed: %s", model, version, shard.key, e)

    def close(self) -> None:
        self.leave()

    def __enter__(self) -> "HubClient":
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    def _need_join(self) -> str:
        if self.worker_id is None:
            raise E.NotJoinedError("call join() before publish/fetch/release")
        return self.worker_id

    def _heartbeat_loop(self) -> None:
        rpc = RpcChannel(self.address, self._token, max(2.0, self.cfg.heartbeat_s * 2), deadline_s=0.0)
        watch = HubConnectionWatch(self.address)
        try:
            while not self._hb_stop.is_set():
                if watch.wait_reconnect(self.cfg.heartbeat_s):
                    rpc.close()  # a request in flight when the hub went is lost: do not wait for it
                if self._hb_stop.is_set():
                    break
                if watch.down:
                    continue  # nobody listens: heartbeat (and re-join) the moment a hub is back
                seen = self._joins
                try:
                    r = rpc.call("heartbeat", wid=self.worker_id)
                except E.NotJoinedError:
                    self._rejoin(rpc, seen)  # the hub restarted (or expired us): re-register what we hold
                    continue
                except E.HubError as e:
                    log.warning("heartbeat to %s failed: %s", self.address, e)
                    continue
                for rid in r.get("drops", []):
                    rep = self.store.remove(rid)
                    self._held.pop(rid, None)
                    if rep is not None:
                        log.info("dropped seed %s (no longer retained)", rid)
                for model, version, key, group in r.get("tasks", []):
                    self._start_seed_fetch(model, version, key, group)
        finally:
            watch.close()
            rpc.close()

    def _rejoin(self, rpc: RpcChannel, seen: int) -> None:
        """Join again under our id and re-register every full replica we hold (soft state).

        `seen` is the re-join count when the caller's call failed with NotJoined: if another thread
        re-joined since, the hub knows us again and this one has nothing to do."""
        with self._rejoin_lock:
            if self._joins != seen:
                return
            try:
                r = rpc.call("join", name=self._name, location=self.location.to_wire(), endpoint=self._endpoint,
                             worker_id=self.worker_id, role=self._role, follow=self._follow)
            except E.HubError as e:
                log.warning("re-join failed: %s", e)
                return
            self._data.verifier = TicketVerifier(r["ticket_key"])
            kept = 0
            for rid, (model, version, shard, slot) in list(self._held.items()):
                rep = self.store.get(rid)
                if rep is None or not rep.complete or rid in self._releasing or rid not in self._held:
                    continue
                try:
                    rpc.call("register", wid=self.worker_id, model=model, version=version, shard=shard.to_wire(),
                             slot=slot, manifest=rep.manifest.to_wire())
                    kept += 1
                except E.HubError as e:  # e.g. a version the new hub never saw committed
                    log.warning("re-register of %s refused: %s; dropping it", rid, e)
                    self.store.remove(rid)
                    self._held.pop(rid, None)
            self._joins += 1
            log.warning("re-joined the hub at %s as %s; re-registered %d replicas", self.address, self.worker_id, kept)

    def _start_seed_fetch(self, model: str, version: int, key: str, group: list) -> None:
        """Seed worker: fetch a version the hub asked us to keep (hand-off or follow-latest)."""
        tp, pp = (int(x[2:]) for x in key.split("-"))
        shard = Shard(tp=tp, pp=pp, tp_size=group[0], pp_size=group[1])
        job = (model, version, key)
        if job in self._seeding:
            return
        self._seeding.add(job)

        def run() -> None:
            try:
                self.fetch(model, version, shard=shard)
                log.info("seed worker %s now holds %s v%d %s", self.worker_id, model, version, key)
            except E.HubError as e:
                log.warning("seed fetch of %s v%d %s failed: %s", model, version, key, e)
            finally:
                self._seeding.discard(job)

        threading.Thread(target=run, name="rlsync-seed-fetch", daemon=True).start()

    def _call(self, op: str, **kw):
        """A control call; if the hub no longer knows us (restart, failover), re-join and retry once."""
        for attempt in range(3):
            seen = self._joins
            try:
                return self._rpc.call(op, **kw)
            except E.NotJoinedError:
                # Another thread may have re-joined meanwhile (then the retry just works), or the hub
                # expired us again right after a re-join (a stalled, overloaded machine): re-join again.
                if self.worker_id is None or attempt == 2:
                    raise
                self._rejoin(self._rpc, seen)

    # ------------------------------------------------------------------ publish / release
    def publish(self, model: str, version: int, tensors: dict[str, torch.Tensor],
                shard: Shard = Shard()) -> bool:
        """Register live `tensors` as version `version` of `model` (this shard). No copy.

        Returns True when this publish completed the version's shard group (it is now `latest`).
        The tensors must not change until `release(model, version, shard)` returns.
        """
        wid = self._need_join()
        _check_coords("publish", model, version, shard)
        _check_tensors(tensors, "tensors")
        rid = f"{wid}:{model}:{version}:{shard.key}:live"
        if rid in self._held:
            raise E.VersionError(f"{model!r} v{version} {shard.key} already published by this worker")
        if any(t.device.type == "cuda" for t in tensors.values()):
            local = cuda.DeviceReplica.for_publish(rid, tensors, self.cfg.manifest)  # pinned host mirror
        else:
            local = LocalReplica(rid, build_manifest(tensors, self.cfg.manifest), dict(tensors), full=True)
        manifest = local.manifest
        self.store.add(local)
        try:
            r = self._call("publish", wid=wid, model=model, version=version, shard=shard.to_wire(),
                               manifest=manifest.to_wire())
            committed = bool(r["committed"])
        except E.VersionError:
            # A retried publish whose first try did land (and committed) before the hub answered.
            committed = self._already_committed(model, version, shard, manifest) if self._rpc.retried else None
            if committed is None:
                self.store.remove(rid)
                raise
        except Exception:
            self.store.remove(rid)
            raise
        self._held[rid] = (model, version, shard, "live")
        return committed

    def _already_committed(self, model, version, shard, manifest) -> bool | None:
        try:
            self._call("register", wid=self.worker_id, model=model, version=version, shard=shard.to_wire(),
                           slot="live", manifest=manifest.to_wire())
            return True
        except E.HubError:
            return None

    def release(self, model: str, version: int, shard: Shard = Shard()) -> None:
        """Give back this worker's replica of (model, version, shard); afterwards its buffers are yours.

        Returns only when the hub routes no read to it and in-flight reads have drained. If it is the
        last full replica of a retained version, the retention policy runs first (wait for a relay,
        or offload-seed a host copy this worker keeps serving until the hub drops it).
        """
        wid = self._need_join()
        _check_coords("release", model, version, shard)
        rid = f"{wid}:{model}:{version}:{shard.key}:live"
        if rid not in self._held:
            raise E.NotAReplicaError(f"this worker holds no replica of {model!r} v{version} {shard.key}")
        self._release(rid)

    def _release(self, rid: str) -> None:
        deadline = None if self.cfg.release_timeout_s is None else time.monotonic() + self.cfg.release_timeout_s
        self._release_loop(rid, handoff=False, deadline=deadline)

    def _release_loop(self, rid: str, handoff: bool, deadline: float | None) -> str:
        """Drive a release to the end; returns 'done', or 'seed' when a hand-off found no taker."""
        with self._rejoin_lock:  # a re-join in progress finishes first; later ones skip this replica
            self._releasing.add(rid)
        try:
            return self._release_steps(rid, handoff, deadline)
        finally:
            self._releasing.discard(rid)

    def _release_steps(self, rid: str, handoff: bool, deadline: float | None) -> str:
        model, version, shard, slot = self._held[rid]
        t0, sent, reregistered = time.monotonic(), False, 0
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise E.TimeoutError_(f"release of {model!r} v{version} {shard.key} did not finish in time "
                                      "(readers still draining); its buffers must not change yet")
            try:
                # A pending release is answered when readers drain: poll in short tries, and ping
                # between them so a dead hub surfaces as HubUnavailableError after hub_deadline_s.
                outcome = self._call("release", attempt_s=5.0, deadline_s=0.0, wid=self.worker_id, model=model,
                                         version=version, shard=shard.to_wire(), slot=slot, handoff=handoff)
            except E.HubUnavailableError:
                self._rpc.call("ping")
                sent = True
                continue
            except E.NotAReplicaError:
                # A restarted hub has not heard of it (a re-join skips replicas being released), or an
                # earlier try completed and its answer was lost: the buffers are still intact, so
                # register it again and let this hub's retention decide. Bounded: hubs may restart again.
                if reregistered < 3 and self._reregister(rid):
                    reregistered += 1
                    continue
                if sent:
                    outcome = "done"
                else:
                    raise
            if outcome == "done":
                break
            if outcome != "seed":
                raise E.ProtocolError(f"unexpected release outcome {outcome!r}")
            if handoff:
                return "seed"
            self._offload_seed(rid)
        rep = self.store.remove(rid)
        self._held.pop(rid, None)
        if rep is not None and not rep.wait_drained(self.cfg.dataplane.io_timeout_s):
            log.warning("release of %s: a local read did not finish within %.0fs", rid,
                        self.cfg.dataplane.io_timeout_s)
        log.debug("released %s in %.3fs", rid, time.monotonic() - t0)
        return "done"

    def _reregister(self, rid: str) -> bool:
        model, version, shard, slot = self._held[rid]
        rep = self.store.get(rid)
        if rep is None or not rep.complete:
            return False
        try:
            self._call("register", wid=self.worker_id, model=model, version=version, shard=shard.to_wire(),
                       slot=slot, manifest=rep.manifest.to_wire())
            return True
        except E.HubError:
            return False

    def _offload_seed(self, rid: str) -> None:
        """Copy a replica into host memory this worker's data-plane server keeps serving."""
        model, version, shard, _ = self._held[rid]
        rep = self.store.get(rid)
        seed_rid = rid.rsplit(":", 1)[0] + ":seed"
        copies = {name: t.detach().clone() for name, t in rep.tensors.items()}
        self.store.add(LocalReplica(seed_rid, rep.manifest, copies, full=True))
        try:
            self._call("register", wid=self.worker_id, model=model, version=version,
                           shard=shard.to_wire(), slot="seed", manifest=rep.manifest.to_wire())
        except Exception:
            self.store.remove(seed_rid)
            raise
        self._held[seed_rid] = (model, version, shard, "seed")
        log.info("offload-seeded %s v%d %s (%.1f MB host copy) to keep it retained",
                 model, version, shard.key, rep.manifest.nbytes / 1e6)

    # ------------------------------------------------------------------ fetch
    def fetch(self, model: str, version: int | str = "latest", into: dict[str, torch.Tensor] | None = None,
              shard: Shard = Shard(), group: tuple[str, int] | None = None,
              on_unit: Callable[[Manifest, int], None] | None = None) -> FetchResult:
        """Pull (model, version, shard) from peers per the hub's plan; verify every unit.

        `version` is 'latest' or a committed version number; `group=(name, size)` pins a reader group
        (e.g. the TP ranks of one inference engine) to one version across its members. Afterwards
        this worker is a full replica and serves the version to others until it releases it.
        `on_unit(manifest, u)` is called from transfer threads once unit `u` has landed and verified
        (to consume tensors while the rest still arrive); a fetch of a version already held calls it
        for no unit.
        """
        wid = self._need_join()
        _check_coords("fetch", model, version, shard)
        if group is not None:
            check_value("fetch", "group", group)
        spec = None
        if into is not None:
            _check_tensors(into, "into")
            spec = [[n, dtype_name(t.dtype), list(t.shape)] for n, t in into.items()]
        t0 = time.monotonic()
        plan = self._call("fetch", wid=wid, model=model, version=version, shard=shard.to_wire(),
                              group=list(group) if group else None, into_spec=spec)
        fid, ver = plan["fetch_id"], plan["version"]
        if plan.get("held"):
            got = self._already_held(model, ver, shard, into, t0)
            if got is not None:
                return got
            plan = self._call("fetch", wid=wid, model=model, version=ver, shard=shard.to_wire(),
                              group=list(group) if group else None, into_spec=spec)
            fid = plan["fetch_id"]
            if plan.get("held"):
                raise E.ProtocolError(f"the hub still lists {model!r} v{ver} {shard.key} as held here")
        rid = f"{wid}:{model}:{ver}:{shard.key}:live"
        try:
            manifest = Manifest.from_wire(plan["manifest"])
            if into is not None:
                cuda.check_into(manifest, into)
            dest_tensors = dict(into) if into is not None else allocate(manifest)
            dest = cuda.make_replica(rid, manifest, dest_tensors, full=False)
            # The hub already advertises this relay: serve it at once (no unit is present yet, so
            # its readers wait on the condition variable), then release whatever version these
            # buffers held before writing into them (the mutability contract).
            self.store.add(dest)
            if into is not None:
                self._release_overlapping(into)
        except BaseException as e:
            if self.store.get(rid) is not None:
                self.store.get(rid).fail(f"fetch refused: {e}")  # readers planned on the relay stop waiting
            self.store.remove(rid)
            self._fetch_done(fid, ok=False)
            raise
        per_source: dict[str, int] = {}
        used: dict[str, str] = {}
        sources, attempts = plan["sources"], 0
        try:
            while True:
                failed, errors = self._pull_all(sources, dest, per_source, used, on_unit)
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
                        sources = self._call("replan", wid=wid, fetch_id=fid, failed=failed, units=missing)["sources"]
                    except E.UnknownFetchError:
                        # The hub restarted (or expired us) since it planned this fetch: plan it anew. The
                        # units already here stay; only missing ones are pulled (from whoever holds them now).
                        plan = self._call("fetch", wid=wid, model=model, version=ver, shard=shard.to_wire(),
                                          group=None, into_spec=spec)
                        if plan.get("held"):
                            raise E.ProtocolError(f"the hub lists {model!r} v{ver} {shard.key} as held here "
                                                  "while this worker is still fetching it") from None
                        fid, sources = plan["fetch_id"], plan["sources"]
                except E.HubError as e:
                    self._abort_fetch(dest, fid, e)
        except E.HubError:
            raise  # _abort_fetch already failed the relay and told the hub
        except Exception as e:  # a bug, not a peer: still fail the relay so its readers do not wait
            log.exception("fetch %s failed unexpectedly", fid)
            self._abort_fetch(dest, fid, e)
        self._fetch_done(fid, ok=True, rep=dest, model=model, version=ver, shard=shard)
        self._held[rid] = (model, ver, shard, "live")
        secs = time.monotonic() - t0
        result = FetchResult(ver, dest_tensors, per_source, used, secs, manifest.nbytes, manifest)
        if self.on_fetch is not None:
            self.on_fetch(result)
        return result

    def _already_held(self, model: str, ver: int, shard: Shard, into, t0: float) -> FetchResult | None:
        """This worker already holds (model, ver, shard): no transfer. Copy into `into` if it is
        other memory (that copy is private: it is not registered as a replica).

        Whatever replica lived in `into` before is released first, as for a transfer: those buffers
        are about to hold `ver`, so neither this client nor the hub may keep them as another version.
        Returns None if the hub's record is stale (we hold no such replica here): the caller re-plans.
        """
        rid = f"{self.worker_id}:{model}:{ver}:{shard.key}:live"
        rep = self.store.get(rid)
        if rep is None or rid not in self._held:
            self._forget_stale(model, ver, shard)
            return None
        held = getattr(rep, "device_tensors", rep.tensors)
        if into is None:
            out = held
        else:
            same = all(t.data_ptr() == held[name].data_ptr() for name, t in into.items())
            if not same:
                if _overlaps(held.values(), into.values()):
                    raise E.BufferMismatchError(f"into overlaps the buffers that hold {model!r} v{ver} "
                                                "without being them: pass those buffers or separate memory")
                self._release_overlapping(into)
                for name, t in into.items():
                    t.copy_(held[name])
            out = dict(into)
        return FetchResult(ver, out, {}, {}, time.monotonic() - t0, 0, rep.manifest)

    def _forget_stale(self, model: str, version: int, shard: Shard) -> None:
        """The hub lists a replica as ours that this client does not hold: make the hub drop it."""
        log.warning("hub listed %s v%d %s as held here, but it is not: releasing the stale record",
                    model, version, shard.key)
        try:
            self._call("release", wid=self.worker_id, model=model, version=version,
                       shard=shard.to_wire(), slot="live")
        except E.NotAReplicaError:
            pass

    def _pull_all(self, sources: list[dict], dest: LocalReplica, per_source: dict, used: dict, on_unit=None):
        """Pull every source's units in parallel; returns (failed replica ids, errors)."""
        failed: list[str] = []
        errors: list[BaseException] = []

        def pull(src: dict) -> None:
            units = [u for u in src["units"] if not dest.present[u]]
            lock = threading.Lock()
            per_source.setdefault(src["worker"], 0)

            def landed(u: int) -> None:  # count units as they verify, so a failed source's part counts
                with lock:
                    per_source[src["worker"]] += dest.manifest.units[u].nbytes
                if on_unit is not None:
                    on_unit(dest.manifest, u)

            try:
                transport = choose_transport(self._endpoint, src["endpoint"], self.cfg.transport)
                used[src["worker"]] = transport.name
                read_from_source(transport, src["endpoint"], src["ticket"], src["replica"], units, dest,
                                 self.cfg.dataplane.io_timeout_s, on_unit=landed, streams=self.cfg.dataplane.streams,
                                 reader=self._reader_key)
            except BaseException as e:  # noqa: BLE001 - reported to the caller's thread
                failed.append(src["replica"])
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
        self.store.remove(dest.id)
        self._fetch_done(fid, ok=False)
        # Downstream readers may still be reading units that were present. The caller may reuse
        # `into` at once (a retry): its bytes must not change under those reads (mutability contract).
        if not dest.wait_drained(self.cfg.dataplane.io_timeout_s):
            log.warning("aborted fetch %s: a downstream read did not finish within %.0fs", fid,
                        self.cfg.dataplane.io_timeout_s)
        raise err if isinstance(err, E.HubError) else E.TransferError(f"fetch failed: {err}")

    def _fetch_done(self, fid: str, ok: bool, rep: LocalReplica | None = None, model: str = "",
                    version: int = 0, shard: Shard = Shard()) -> None:
        try:
            self._call("fetch_done", wid=self.worker_id, fetch_id=fid, ok=ok)
        except E.ProtocolError:
            if ok and rep is not None:
                # The hub restarted while we fetched (it forgot the fetch): announce the replica.
                try:
                    self._call("register", wid=self.worker_id, model=model, version=version,
                                   shard=shard.to_wire(), slot="live", manifest=rep.manifest.to_wire())
                except E.HubError as e:
                    log.warning("register after fetch %s failed: %s", fid, e)
        except E.HubError as e:
            log.warning("fetch_done(%s) failed: %s", fid, e)

    def _release_overlapping(self, into: dict[str, torch.Tensor]) -> None:
        for rid, (_, _, _, slot) in list(self._held.items()):
            rep = self.store.get(rid)
            if slot != "live" or rep is None:
                continue
            if _overlaps(getattr(rep, "device_tensors", rep.tensors).values(), into.values()):
                self._release(rid)

    # ------------------------------------------------------------------ queries
    def latest(self, model: str) -> int | None:
        return self._call("latest", model=model)

    def versions(self, model: str) -> dict:
        """{"latest", "committed": every version number committed (ascending), "retained": those the
        retention policy keeps fetchable, "held": those some worker holds a full replica of now}."""
        return self._call("versions", model=model)

    def stats(self) -> dict:
        return self._call("stats")

    def held(self) -> list[str]:
        return sorted(self._held)
