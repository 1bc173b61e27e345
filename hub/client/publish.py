"""The client's publish part: register live tensors as a version (no copy), and give them back: drive
a release to the end, re-registering after a hub restart and offload-seeding a host copy when
retention says the last replica of a retained version must not go; hand replicas off when the worker
leaves with notice.

It holds the session (control calls, identity), the replica book and its own publish thread; the
`HubClient` facade (hub/client/__init__.py) delegates to it.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from rlsync.hub import errors as E
from rlsync.hub.client.config import ClientConfig
from rlsync.hub.client.replicas import Replicas
from rlsync.hub.client.session import Session
from rlsync.hub.model.manifest import ManifestConfig, build_manifest
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.shard import Shard
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.dataplane import device
from rlsync.hub.protocol.args import check_coords as _check_coords

log = logging.getLogger("rlsync.hub.client")  # one logger for the whole client (log set-up names it)


class Publisher:
    """Publish and release (with offload-seeding, re-registration and hand-off on leave)."""

    def __init__(self, session: Session, replicas: Replicas, cfg: ClientConfig) -> None:
        self.session, self.replicas, self.cfg = session, replicas, cfg
        self.pending: dict[str, Future] = {}
        """Publishes in flight (`publish_async`), by replica id: release and leave wait for them."""
        self.pool: ThreadPoolExecutor | None = None

    def publish(self, model: str, version: int, tensors: dict[str, torch.Tensor],
                shard: Shard = Shard(), manifest_config: ManifestConfig | None = None) -> bool:
        """Register live `tensors` as version `version` of `model` (this shard). No copy.

        Returns True when this publish completed the version's shard group (it is now `latest`).
        The tensors must not change until `release(model, version, shard)` returns.
        `manifest_config` cuts this shard's transfer units (default: the client's `cfg.manifest`);
        e.g. a sharded publish cuts small units so slice readers fetch only the units they need.
        """
        wid = self.session.need_join()
        _check_coords("publish", model, version, shard)
        device.check_tensors(tensors, "tensors")
        rid = ReplicaId(wid, model, version, shard.key).wire
        if rid in self.replicas.held:
            raise E.VersionError(f"{model!r} v{version} {shard.key} already published by this worker")
        mcfg = manifest_config or self.cfg.manifest
        if any(t.device.type == "cuda" for t in tensors.values()):
            local = device.DeviceReplica.for_publish(rid, tensors, mcfg)  # pinned host mirror
        else:
            local = LocalReplica(rid, build_manifest(tensors, mcfg), dict(tensors), full=True)
        manifest = local.manifest
        self.replicas.store.add(local)
        try:
            home = {"home": self.session.publishes_for} if self.session.publishes_for else {}
            r = self.session.call("publish", wid=wid, model=model, version=version, shard=shard.to_wire(),
                               manifest=manifest.to_wire(), **home)
            committed = bool(r["committed"])
        except E.VersionError:
            # A retried publish whose first try did land (and committed) before the hub answered.
            committed = self._already_committed(model, version, shard, manifest) if self.session.rpc.retried else None
            if committed is None:
                self.replicas.store.remove(rid)
                raise
        except Exception:
            self.replicas.store.remove(rid)
            raise
        self.replicas.hold(rid, model, version, shard, "live", origin=True)
        return committed

    def publish_async(self, model: str, version: int, tensors: dict[str, torch.Tensor],
                      shard: Shard = Shard(), manifest_config: ManifestConfig | None = None) -> "Future[bool]":
        """`publish`, with its checksum pass and the hub round trip on this client's publish thread.

        Returns once the arguments are checked (bad input raises here, as `publish` does, and changes
        nothing); `result()` is `publish`'s return value or its typed error. The version becomes
        visible only when the publish lands, exactly as with `publish` (every unit checksummed from
        these tensors, then registered). The contract is the same: the tensors must not change until
        `release(model, version, shard)` returns — and `release` (and `leave`) first wait for the
        publish to land, raising its error if it failed. What it saves the caller is the one pass over
        the bytes (memory speed: ~4 ms for a 36 MB ZeRO-3 shard here): e.g. a trainer's next forward
        and backward, which read the parameters but do not write them, run meanwhile.
        """
        self.session.need_join()
        _check_coords("publish", model, version, shard)
        device.check_tensors(tensors, "tensors")
        rid = ReplicaId(self.session.worker_id, model, version, shard.key).wire
        if rid in self.replicas.held or rid in self.pending:
            raise E.VersionError(f"{model!r} v{version} {shard.key} already published by this worker")
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlsync-publish")
        fut = self.pool.submit(self.publish, model, version, dict(tensors), shard, manifest_config)
        self.pending[rid] = fut
        return fut

    def landed(self, rid: str, timeout: float | None = None) -> None:
        """Wait for a `publish_async` of `rid` to land; raise its error if it failed."""
        fut = self.pending.get(rid)
        if fut is not None:
            try:
                fut.result(timeout)
            finally:
                if fut.done():
                    self.pending.pop(rid, None)

    def _already_committed(self, model, version, shard, manifest) -> bool | None:
        try:
            self.session.call("register", wid=self.session.worker_id, model=model, version=version, shard=shard.to_wire(),
                           slot="live", manifest=manifest.to_wire(), origin=True)
            return True
        except E.HubError:
            return None

    def release(self, model: str, version: int, shard: Shard = Shard()) -> None:
        """Give back this worker's replica of (model, version, shard); afterwards its buffers are yours.

        Returns only when the hub routes no read to it and in-flight reads have drained. If it is the
        last full replica of a retained version, the retention policy runs first (wait for a relay,
        or offload-seed a host copy this worker keeps serving until the hub drops it).
        """
        wid = self.session.need_join()
        _check_coords("release", model, version, shard)
        rid = ReplicaId(wid, model, version, shard.key).wire
        self.landed(rid)  # a publish_async of it still in flight lands first (or raises its error)
        if rid not in self.replicas.held:
            raise E.NotAReplicaError(f"this worker holds no replica of {model!r} v{version} {shard.key}")
        self.release_replica(rid)

    def release_replica(self, rid: str) -> None:
        deadline = None if self.cfg.release_timeout_s is None else time.monotonic() + self.cfg.release_timeout_s
        self.release_loop(rid, handoff=False, deadline=deadline)

    def release_loop(self, rid: str, handoff: bool, deadline: float | None) -> str:
        """Drive a release to the end; returns 'done', or 'seed' when a hand-off found no taker."""
        with self.session.rejoin_lock:  # a re-join in progress finishes first; later ones skip this replica
            self.replicas.releasing.add(rid)
        try:
            return self._release_steps(rid, handoff, deadline)
        finally:
            self.replicas.releasing.discard(rid)

    def _release_steps(self, rid: str, handoff: bool, deadline: float | None) -> str:
        model, version, shard, slot = self.replicas.held[rid]
        t0, sent, reregistered = time.monotonic(), False, 0
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise E.TimeoutError_(f"release of {model!r} v{version} {shard.key} did not finish in time "
                                      "(readers still draining); its buffers must not change yet")
            try:
                # A pending release is answered when readers drain: poll in short tries, and ping
                # between them so a dead hub surfaces as HubUnavailableError after hub_deadline_s.
                outcome = self.session.call("release", attempt_s=5.0, deadline_s=0.0, wid=self.session.worker_id, model=model,
                                         version=version, shard=shard.to_wire(), slot=slot, handoff=handoff)
            except E.HubUnavailableError:
                self.session.rpc.call("ping")
                sent = True
                continue
            except E.NotAReplicaError:
                # A restarted hub has not heard of it (a re-join skips replicas being released), or an
                # earlier try completed and its answer was lost: the buffers are still intact, so
                # register it again and let this hub's retention decide. Bounded: hubs may restart again.
                if reregistered < 3 and self.reregister(rid):
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
        self.released(rid)
        log.debug("released %s in %.3fs", rid, time.monotonic() - t0)
        return "done"

    def released(self, rid: str) -> None:
        """The hub released `rid` (routes no read to it): drop it here once local reads drain."""
        rep = self.replicas.drop(rid)
        if rep is not None and not rep.wait_drained(self.cfg.dataplane.io_timeout_s):
            log.warning("release of %s: a local read did not finish within %.0fs", rid,
                        self.cfg.dataplane.io_timeout_s)

    def reregister(self, rid: str) -> bool:
        model, version, shard, slot = self.replicas.held[rid]
        rep = self.replicas.complete(rid)
        if rep is None:
            return False
        try:
            self.session.call("register", wid=self.session.worker_id, model=model, version=version, shard=shard.to_wire(),
                       slot=slot, manifest=rep.manifest.to_wire(), origin=rid in self.replicas.published)
            return True
        except E.HubError:
            return False

    def _offload_seed(self, rid: str) -> None:
        """Copy a replica into host memory this worker's data-plane server keeps serving."""
        model, version, shard, _ = self.replicas.held[rid]
        rep = self.replicas.store.get(rid)
        seed_rid = ReplicaId.parse(rid).as_seed().wire
        copies = {name: t.detach().clone() for name, t in rep.tensors.items()}
        self.replicas.store.add(LocalReplica(seed_rid, rep.manifest, copies, full=True))
        try:
            self.session.call("register", wid=self.session.worker_id, model=model, version=version,
                           shard=shard.to_wire(), slot="seed", manifest=rep.manifest.to_wire())
        except Exception:
            self.replicas.store.remove(seed_rid)
            raise
        self.replicas.hold(seed_rid, model, version, shard, "seed")
        log.info("offload-seeded %s v%d %s (%.1f MB host copy) to keep it retained",
                 model, version, shard.key, rep.manifest.nbytes / 1e6)

    # ------------------------------------------------------------------ leaving
    def drain(self) -> None:
        """Publishes in flight land (or fail, logged) and the publish thread stops: before the worker goes."""
        for rid in list(self.pending):
            try:
                self.landed(rid)
            except E.HubError as e:
                log.warning("leave: publish of %s: %s", rid, e)
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None

    def handoff_all(self, deadline_s: float) -> None:
        """Leaving with notice: each replica that is the last full copy of a retained version is handed
        off (to a reader already fetching it, or a seed worker the hub picks) within the deadline."""
        end = time.monotonic() + deadline_s
        for rid in list(self.replicas.held):
            entry = self.replicas.entry(rid)
            if entry is None or entry[3] == "seed":
                continue
            model, version, shard, _ = entry
            try:
                outcome = self.release_loop(rid, handoff=True, deadline=end)
                if outcome == "seed":
                    log.error("leaving: no reader or seed worker can take %s v%d %s; it is lost when we go",
                              model, version, shard.key)
            except E.HubError as e:
                log.error("leaving: hand-off of %s v%d %s failed: %s", model, version, shard.key, e)
