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

import torch

from . import errors as E
from .dataplane import DataPlaneConfig, DataServer, read_from_source
from .location import Location
from .manifest import Manifest, ManifestConfig, allocate, build_manifest, dtype_name
from .rpc import RpcChannel, read_or_create_token
from .shard import Shard
from .store import LocalReplica, ReplicaStore
from .tickets import TicketVerifier
from .transports import available_transports, choose_transport
from .transports.shm import boot_id

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class ClientConfig:
    manifest: ManifestConfig = field(default_factory=ManifestConfig)
    """How published tensors are cut into transfer units."""
    dataplane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    """This worker's data-plane server."""
    transport: str | None = None
    """Force one transport ('tcp-py', 'shm', ...) instead of the best usable per peer."""
    rpc_timeout_s: float = 30.0
    """Deadline of one control RPC; past it the client raises HubUnavailableError."""
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

    @property
    def gbps(self) -> float:
        return self.nbytes * 8 / 1e9 / self.seconds if self.seconds > 0 else 0.0


def _check_tensors(tensors: dict, what: str) -> None:
    if not isinstance(tensors, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in tensors.items()):
        raise E.BufferMismatchError(f"{what} must be a dict of str -> torch.Tensor")
    for k, v in tensors.items():
        if v.device.type != "cpu":
            raise E.BufferMismatchError(f"{what}[{k!r}] is on {v.device}: host tensors only on this transport")
        if not v.is_contiguous():
            raise E.BufferMismatchError(f"{what}[{k!r}] is not contiguous: pass .contiguous() tensors")
        dtype_name(v.dtype)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


class HubClient:
    def __init__(self, address: str, token: str | None = None, *, token_file: str | None = None,
                 config: ClientConfig | None = None) -> None:
        if token is None:
            token = read_or_create_token(token_file) if token_file else os.environ.get("RLSYNC_HUB_TOKEN")
        if not token:
            raise E.AuthError("HubClient needs the hub's token (token=, token_file= or $RLSYNC_HUB_TOKEN)")
        self.address, self.cfg = address, config or ClientConfig()
        self._token = token
        self._rpc = RpcChannel(address, token, self.cfg.rpc_timeout_s)
        self.store = ReplicaStore()
        self._held: dict[str, tuple[str, int, Shard, str]] = {}
        self._data: DataServer | None = None
        self.worker_id: str | None = None
        self.location: Location | None = None
        self._endpoint: dict = {}
        self._hb_stop = threading.Event()
        self._hb: threading.Thread | None = None

    # ------------------------------------------------------------------ membership
    def join(self, location: Location | None = None, name: str = "worker") -> str:
        if self.worker_id is not None:
            raise E.HubError("already joined; call leave() first")
        self.location = location or Location()
        self._data = DataServer(self.store, self.cfg.dataplane)
        self._endpoint = {"tcp": self._data.address, "pid": os.getpid(), "boot_id": boot_id(),
                          "host": self.location.host, "transports": available_transports()}
        try:
            r = self._rpc.call("join", name=name, location=self.location.to_wire(), endpoint=self._endpoint)
        except Exception:
            self._data.close()
            self._data = None
            raise
        self.worker_id = r["wid"]
        self._data.worker_id = self.worker_id
        self._data.verifier = TicketVerifier(r["ticket_key"])
        self._hb_stop.clear()
        self._hb = threading.Thread(target=self._heartbeat_loop, name="rlsync-heartbeat", daemon=True)
        self._hb.start()
        return self.worker_id

    def leave(self) -> None:
        """Leave the hub: stop serving and drop every replica held here."""
        if self.worker_id is None:
            return
        self._hb_stop.set()
        if self._hb is not None:
            self._hb.join(timeout=5)
        try:
            self._rpc.call("leave", timeout_s=min(5.0, self.cfg.rpc_timeout_s), wid=self.worker_id)
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
        rpc = RpcChannel(self.address, self._token, max(5.0, self.cfg.heartbeat_s * 5))
        try:
            while not self._hb_stop.wait(self.cfg.heartbeat_s):
                try:
                    r = rpc.call("heartbeat", wid=self.worker_id)
                except E.HubError as e:
                    log.warning("heartbeat to %s failed: %s", self.address, e)
                    continue
                for rid in r.get("drops", []):
                    rep = self.store.remove(rid)
                    self._held.pop(rid, None)
                    if rep is not None:
                        log.info("dropped seed %s (no longer retained)", rid)
        finally:
            rpc.close()

    # ------------------------------------------------------------------ publish / release
    def publish(self, model: str, version: int, tensors: dict[str, torch.Tensor],
                shard: Shard = Shard()) -> bool:
        """Register live `tensors` as version `version` of `model` (this shard). No copy.

        Returns True when this publish completed the version's shard group (it is now `latest`).
        The tensors must not change until `release(model, version, shard)` returns.
        """
        wid = self._need_join()
        _check_tensors(tensors, "tensors")
        manifest = build_manifest(tensors, self.cfg.manifest)
        rid = f"{wid}:{model}:{version}:{shard.key}:live"
        if rid in self._held:
            raise E.VersionError(f"{model!r} v{version} {shard.key} already published by this worker")
        self.store.add(LocalReplica(rid, manifest, dict(tensors), full=True))
        try:
            r = self._rpc.call("publish", wid=wid, model=model, version=version, shard=shard.to_wire(),
                               manifest=manifest.to_wire())
        except Exception:
            self.store.remove(rid)
            raise
        self._held[rid] = (model, version, shard, "live")
        return bool(r["committed"])

    def release(self, model: str, version: int, shard: Shard = Shard()) -> None:
        """Give back this worker's replica of (model, version, shard); afterwards its buffers are yours.

        Returns only when the hub routes no read to it and in-flight reads have drained. If it is the
        last full replica of a retained version, the retention policy runs first (wait for a relay,
        or offload-seed a host copy this worker keeps serving until the hub drops it).
        """
        wid = self._need_join()
        rid = f"{wid}:{model}:{version}:{shard.key}:live"
        if rid not in self._held:
            raise E.NotAReplicaError(f"this worker holds no replica of {model!r} v{version} {shard.key}")
        self._release(rid)

    def _release(self, rid: str) -> None:
        model, version, shard, slot = self._held[rid]
        t0 = time.monotonic()
        while True:
            outcome = self._rpc.call("release", timeout_s=self.cfg.release_timeout_s, wid=self.worker_id,
                                     model=model, version=version, shard=shard.to_wire(), slot=slot)
            if outcome == "done":
                break
            if outcome != "seed":
                raise E.ProtocolError(f"unexpected release outcome {outcome!r}")
            self._offload_seed(rid)
        rep = self.store.remove(rid)
        self._held.pop(rid, None)
        if rep is not None and not rep.wait_drained(self.cfg.dataplane.io_timeout_s):
            log.warning("release of %s: a local read did not finish within %.0fs", rid,
                        self.cfg.dataplane.io_timeout_s)
        log.debug("released %s in %.3fs", rid, time.monotonic() - t0)

    def _offload_seed(self, rid: str) -> None:
        """Copy a replica into host memory this worker's data-plane server keeps serving."""
        model, version, shard, _ = self._held[rid]
        rep = self.store.get(rid)
        seed_rid = rid.rsplit(":", 1)[0] + ":seed"
        copies = {name: t.detach().clone() for name, t in rep.tensors.items()}
        self.store.add(LocalReplica(seed_rid, rep.manifest, copies, full=True))
        try:
            self._rpc.call("register", wid=self.worker_id, model=model, version=version,
                           shard=shard.to_wire(), slot="seed", manifest=rep.manifest.to_wire())
        except Exception:
            self.store.remove(seed_rid)
            raise
        self._held[seed_rid] = (model, version, shard, "seed")
        log.info("offload-seeded %s v%d %s (%.1f MB host copy) to keep it retained",
                 model, version, shard.key, rep.manifest.nbytes / 1e6)

    # ------------------------------------------------------------------ fetch
    def fetch(self, model: str, version: int | str = "latest", into: dict[str, torch.Tensor] | None = None,
              shard: Shard = Shard(), group: tuple[str, int] | None = None) -> FetchResult:
        """Pull (model, version, shard) from peers per the hub's plan; verify every unit.

        `version` is 'latest' or a committed version number; `group=(name, size)` pins a reader group
        (e.g. the TP ranks of one inference engine) to one version across its members. Afterwards
        this worker is a full replica and serves the version to others until it releases it.
        """
        wid = self._need_join()
        spec = None
        if into is not None:
            _check_tensors(into, "into")
            spec = [[n, dtype_name(t.dtype), list(t.shape)] for n, t in into.items()]
        t0 = time.monotonic()
        plan = self._rpc.call("fetch", wid=wid, model=model, version=version, shard=shard.to_wire(),
                              group=list(group) if group else None, into_spec=spec)
        fid, ver = plan["fetch_id"], plan["version"]
        try:
            manifest = Manifest.from_wire(plan["manifest"])
            if into is not None:
                manifest.check_buffers(into)
                self._release_overlapping(into)
            dest_tensors = dict(into) if into is not None else allocate(manifest)
            rid = f"{wid}:{model}:{ver}:{shard.key}:live"
            dest = LocalReplica(rid, manifest, dest_tensors, full=False)
        except BaseException:
            self._fetch_done(fid, ok=False)
            raise
        self.store.add(dest)
        per_source, used = {}, {}
        errors: list[BaseException] = []

        def pull(src: dict) -> None:
            try:
                transport = choose_transport(self._endpoint, src["endpoint"], self.cfg.transport)
                used[src["worker"]] = transport.name
                per_source[src["worker"]] = read_from_source(
                    transport, src["endpoint"], src["ticket"], src["replica"], src["units"], dest,
                    self.cfg.dataplane.io_timeout_s, streams=self.cfg.dataplane.streams)
            except BaseException as e:  # noqa: BLE001 - re-raised below on the caller's thread
                errors.append(e)
                dest.fail(str(e))

        threads = [threading.Thread(target=pull, args=(s,), daemon=True) for s in plan["sources"][1:]]
        for t in threads:
            t.start()
        if plan["sources"]:
            pull(plan["sources"][0])
        for t in threads:
            t.join()
        if not errors and not dest.complete:
            errors.append(E.ProtocolError("fetch plan did not cover every unit"))
        if errors:
            dest.fail(str(errors[0]))
            self.store.remove(rid)
            self._fetch_done(fid, ok=False)
            err = errors[0]
            raise err if isinstance(err, E.HubError) else E.TransferError(f"fetch failed: {err}")
        self._fetch_done(fid, ok=True)
        self._held[rid] = (model, ver, shard, "live")
        secs = time.monotonic() - t0
        return FetchResult(ver, dest_tensors, per_source, used, secs, manifest.nbytes)

    def _fetch_done(self, fid: str, ok: bool) -> None:
        try:
            self._rpc.call("fetch_done", wid=self.worker_id, fetch_id=fid, ok=ok)
        except E.HubError as e:
            log.warning("fetch_done(%s) failed: %s", fid, e)

    def _release_overlapping(self, into: dict[str, torch.Tensor]) -> None:
        spans = [_span(t) for t in into.values() if t.numel()]
        for rid, (_, _, _, slot) in list(self._held.items()):
            rep = self.store.get(rid)
            if slot != "live" or rep is None:
                continue
            if any(a < e and s < b for t in rep.tensors.values() if t.numel()
                   for a, b in [_span(t)] for s, e in spans):
                self._release(rid)

    # ------------------------------------------------------------------ queries
    def latest(self, model: str) -> int | None:
        return self._rpc.call("latest", model=model)

    def stats(self) -> dict:
        return self._rpc.call("stats")

    def held(self) -> list[str]:
        return sorted(self._held)
