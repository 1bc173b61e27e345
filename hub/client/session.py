"""The client's membership part: join, leave, heartbeat, re-join after a hub restart, seed-worker tasks,
and `call` (a control RPC that re-joins once if the hub forgot us).

It holds the control channel, this worker's data-plane server and identity, and the replica book
(hub/client/replicas.py) it re-registers after a restart; nothing of publishing or fetching. What a
heartbeat asks of the rest (a seed worker's fetch task) goes through the `on_task` hook the
`HubClient` facade sets (hub/client/__init__.py).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from rlsync.hub import errors as E
from rlsync.hub.client.config import ClientConfig
from rlsync.hub.client.replicas import Replicas
from rlsync.hub.protocol.connection_watch import HubConnectionWatch
from rlsync.hub.dataplane.transfer import DataServer
from rlsync.hub.model.location import Location
from rlsync.hub.protocol.rpc import RpcChannel
from rlsync.hub.model.shard import Shard
from rlsync.hub.protocol.tickets import ReaderKey, TicketVerifier
from rlsync.hub.dataplane.transports import local_endpoint
from rlsync.hub.protocol.messages import Endpoint

log = logging.getLogger("rlsync.hub.client")  # one logger for the whole client (log set-up names it)


class Session:
    """Membership (join / leave / re-join), heartbeats, and the control-RPC wrapper `call`."""

    def __init__(self, address: str, token: str, cfg: ClientConfig, replicas: Replicas) -> None:
        self.address, self.cfg, self.token, self.replicas = address, cfg, token, replicas
        self.rpc = RpcChannel(address, token, cfg.rpc_timeout_s, cfg.hub_deadline_s)
        self.reader_key = ReaderKey()  # proves to sources that this client is its tickets' reader
        self.worker_id: str | None = None
        self.location: Location | None = None
        self.endpoint: Endpoint | None = None
        """This worker's data-plane endpoint once joined (with its reader key: sent only to the hub)."""
        self.data: DataServer | None = None
        self.heartbeat_thread: threading.Thread | None = None
        self._hb_stop = threading.Event()
        self._watch: HubConnectionWatch | None = None  # the heartbeat thread's, while it runs
        self._name, self._role, self._follow = "worker", "worker", False
        self.rejoin_lock = threading.Lock()
        """Held while a re-join re-registers the book; a release marks its replica under it."""
        self.joins = 0
        """Completed re-joins: a thread that saw NotJoined before the last one skips its own."""
        self.rejoined_at: float | None = None
        """When the last re-join (with its re-registrations) finished (time.monotonic())."""
        self._seeding: set[tuple] = set()
        self.on_task: Callable[[str, int, Shard], object] | None = None
        """What a seed worker runs for a hub task (model, version, shard): the facade's fetch."""
        self.hub_id: str | None = None
        """The hub's id (its journal keeps it across restarts), from the last join's answer."""
        self.publishes_for: str | None = None
        """A federation gateway's local client: the id of the home hub its publishes bring versions from."""

    def join(self, location: Location | None = None, name: str = "worker", *, role: str = "worker",
             follow: bool = False) -> str:
        """Join the hub and start serving. `role="seed"` makes this a seed worker: it takes hand-offs
        from leaving workers and, with `follow=True`, keeps a copy of every model's latest version."""
        if self.worker_id is not None:
            raise E.AlreadyJoinedError(f"already joined as {self.worker_id}; call leave() first")
        if location is not None and not isinstance(location, Location):
            raise E.InvalidArgumentError(f"location must be a Location, got {type(location).__name__}")
        self.location = location or Location()
        self.data = DataServer(self.replicas.store, self.cfg.dataplane)
        self.endpoint = local_endpoint(self.data.address, os.getpid(), self.location.host, self.reader_key.public_bytes)
        try:
            r = self.rpc.call("join", name=name, location=self.location.to_wire(), endpoint=self.endpoint.to_wire(),
                               role=role, follow=follow)
        except Exception:
            self.data.close()
            self.data = None
            raise
        self.worker_id, self.hub_id = r["wid"], r.get("hub_id")
        self._name, self._role, self._follow = name, role, follow
        self.data.worker_id = self.worker_id
        self.data.verifier = TicketVerifier(r["ticket_key"])
        self._hb_stop.clear()
        self.heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="rlsync-heartbeat", daemon=True)
        self.heartbeat_thread.start()
        return self.worker_id

    def leave(self) -> None:
        """Stop heartbeating, tell the hub, drop every replica held here and stop serving. (The facade's
        `HubClient.leave` first lands publishes in flight and, with notice, hands replicas off.)"""
        if self.worker_id is None:
            self.rpc.close()
            return
        self._hb_stop.set()
        watch = self._watch
        if watch is not None:
            watch.interrupt()  # the thread's wait ends now, not at its next heartbeat
        if self.heartbeat_thread is not None:
            self.heartbeat_thread.join(timeout=5)
        try:
            self.rpc.call("leave", attempt_s=2.0, deadline_s=min(5.0, self.cfg.hub_deadline_s), wid=self.worker_id)
        except E.HubError as e:
            log.warning("leave: %s", e)
        self.replicas.clear()
        if self.data is not None:
            self.data.close()
        self.data, self.worker_id = None, None
        self.rpc.close()

    def stop_heartbeat(self) -> None:
        """Stop heartbeating (the thread ends within one period): the hub will expire this worker. For
        tests and tools that need a worker gone silent, or no heartbeat re-join racing their own call."""
        self._hb_stop.set()

    def need_join(self) -> str:
        if self.worker_id is None:
            raise E.NotJoinedError("call join() before publish/fetch/release")
        return self.worker_id

    def _heartbeat_channel(self) -> RpcChannel:
        """The heartbeat thread's own control channel (a heartbeat never waits behind a release).

        It starts as having been answered when the client's channel was (join() was): a heartbeat that
        dies with the hub is then sent again the moment a hub listens, like any call. A fresh channel
        would take the first heartbeat's lost request for a wrong address and wait out its whole try
        (2 s: the last worker to re-register after a restart, issue 18's seed 9)."""
        rpc = RpcChannel(self.address, self.token, max(2.0, self.cfg.heartbeat_s * 2), deadline_s=0.0)
        rpc.answered = self.rpc.answered
        return rpc

    def _heartbeat_loop(self) -> None:
        rpc = self._heartbeat_channel()
        watch = self._watch = HubConnectionWatch(self.address)
        try:
            while not self._hb_stop.is_set():
                if watch.wait_reconnect(self.cfg.heartbeat_s):
                    rpc.close()  # a request in flight when the hub went is lost: do not wait for it
                if self._hb_stop.is_set():
                    break
                if watch.down:
                    continue  # nobody listens: heartbeat (and re-join) the moment a hub is back
                seen = self.joins
                try:
                    r = rpc.call("heartbeat", wid=self.worker_id)
                except E.NotJoinedError:
                    self.rejoin(rpc, seen)  # the hub restarted (or expired us): re-register what we hold
                    continue
                except E.HubError as e:
                    log.warning("heartbeat to %s failed: %s", self.address, e)
                    continue
                r = r or {}  # nil: nothing to drop, no task
                for rid in r.get("drops", []):
                    if self.replicas.drop(rid) is not None:
                        log.info("dropped seed %s (no longer retained)", rid)
                for model, version, key, group in r.get("tasks", []):
                    self._start_seed_fetch(model, version, key, group)
        finally:
            self._watch = None
            watch.close()
            rpc.close()

    def rejoin(self, rpc: RpcChannel, seen: int) -> None:
        """Join again under our id and re-register every full replica we hold (soft state).

        `seen` is the re-join count when the caller's call failed with NotJoined: if another thread
        re-joined since, the hub knows us again and this one has nothing to do."""
        with self.rejoin_lock:
            if self.joins != seen:
                return
            try:
                r = rpc.call("join", name=self._name, location=self.location.to_wire(), endpoint=self.endpoint.to_wire(),
                             worker_id=self.worker_id, role=self._role, follow=self._follow)
            except E.HubError as e:
                log.warning("re-join failed: %s", e)
                return
            self.data.verifier = TicketVerifier(r["ticket_key"])
            kept = 0
            for rid, (model, version, shard, slot) in list(self.replicas.held.items()):
                rep = self.replicas.complete(rid)
                if rep is None or rid in self.replicas.releasing:
                    continue
                try:
                    rpc.call("register", wid=self.worker_id, model=model, version=version, shard=shard.to_wire(),
                             slot=slot, manifest=rep.manifest.to_wire(), origin=rid in self.replicas.published)
                    kept += 1
                except E.HubError as e:  # e.g. a version the new hub never saw committed
                    log.warning("re-register of %s refused: %s; dropping it", rid, e)
                    self.replicas.drop(rid)
            self.joins += 1
            self.rejoined_at = time.monotonic()
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
                self.on_task(model, version, shard)
                log.info("seed worker %s now holds %s v%d %s", self.worker_id, model, version, key)
            except E.HubError as e:
                log.warning("seed fetch of %s v%d %s failed: %s", model, version, key, e)
            finally:
                self._seeding.discard(job)

        threading.Thread(target=run, name="rlsync-seed-fetch", daemon=True).start()

    def call(self, op: str, **kw):
        """A control call; if the hub no longer knows us (restart, failover), re-join and retry once.

        Afterwards `self.rpc.retried` says whether any try of this call may have reached a hub before
        the one that answered (a publish that committed on a hub that died before answering is then
        recognised), including tries before a re-join."""
        retried = False
        for attempt in range(3):
            seen = self.joins
            try:
                out = self.rpc.call(op, **kw)
            except E.NotJoinedError:
                retried = retried or self.rpc.retried
                # Another thread may have re-joined meanwhile (then the retry just works), or the hub
                # expired us again right after a re-join (a stalled, overloaded machine): re-join again.
                if self.worker_id is None or attempt == 2:
                    self.rpc.retried = retried
                    raise
                self.rejoin(self.rpc, seen)  # its own calls reset the channel's flag: ours is kept here
                continue
            except BaseException:
                self.rpc.retried = retried or self.rpc.retried
                raise
            self.rpc.retried = retried or self.rpc.retried
            return out
