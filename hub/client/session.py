"""HubClient's membership and control connection: join, leave (with hand-off), heartbeat, re-join
after a hub restart, seed-worker tasks, and `_call` (a control RPC that re-joins once if the hub
forgot us).

A mixin of `HubClient` (hub/client/__init__.py): it uses the attributes `HubClient.__init__` sets.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from rlsync.hub import errors as E
from rlsync.hub.protocol.connection_watch import HubConnectionWatch
from rlsync.hub.dataplane.transfer import DataServer
from rlsync.hub.model.location import Location
from rlsync.hub.protocol.rpc import RpcChannel
from rlsync.hub.model.shard import Shard
from rlsync.hub.protocol.tickets import TicketVerifier
from rlsync.hub.dataplane.transports import endpoint_info

log = logging.getLogger("rlsync.hub.client")  # one logger for the whole client (log set-up names it)


class Session:
    """Membership (join / leave / re-join), heartbeats, and the control-RPC wrapper."""

    def join(self, location: Location | None = None, name: str = "worker", *, role: str = "worker",
             follow: bool = False) -> str:
        """Join the hub and start serving. `role="seed"` makes this a seed worker: it takes hand-offs
        from leaving workers and, with `follow=True`, keeps a copy of every model's latest version."""
        if self.worker_id is not None:
            raise E.AlreadyJoinedError(f"already joined as {self.worker_id}; call leave() first")
        if location is not None and not isinstance(location, Location):
            raise E.InvalidArgumentError(f"location must be a Location, got {type(location).__name__}")
        self.location = location or Location()
        self._data = DataServer(self.store, self.cfg.dataplane)
        self._endpoint = {"tcp": self._data.address, "pid": os.getpid(), "host": self.location.host,
                          "reader_key": self._reader_key.public_bytes, **endpoint_info()}
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
        for rid in list(self._pending_pub):  # publishes in flight land (or fail) before the worker goes
            try:
                self._landed(rid)
            except E.HubError as e:
                log.warning("leave: publish of %s: %s", rid, e)
        if self._pub_pool is not None:
            self._pub_pool.shutdown(wait=True)
            self._pub_pool = None
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
        self._published.clear()
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

    def _heartbeat_channel(self) -> RpcChannel:
        """The heartbeat thread's own control channel (a heartbeat never waits behind a release).

        It starts as having been answered when the client's channel was (join() was): a heartbeat that
        dies with the hub is then sent again the moment a hub listens, like any call. A fresh channel
        would take the first heartbeat's lost request for a wrong address and wait out its whole try
        (2 s: the last worker to re-register after a restart, issue 18's seed 9)."""
        rpc = RpcChannel(self.address, self._token, max(2.0, self.cfg.heartbeat_s * 2), deadline_s=0.0)
        rpc.answered = self._rpc.answered
        return rpc

    def _heartbeat_loop(self) -> None:
        rpc = self._heartbeat_channel()
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
                r = r or {}  # nil: nothing to drop, no task
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
                             slot=slot, manifest=rep.manifest.to_wire(), origin=rid in self._published)
                    kept += 1
                except E.HubError as e:  # e.g. a version the new hub never saw committed
                    log.warning("re-register of %s refused: %s; dropping it", rid, e)
                    self.store.remove(rid)
                    self._held.pop(rid, None)
            self._joins += 1
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
                self.fetch(model, version, shard=shard)
                log.info("seed worker %s now holds %s v%d %s", self.worker_id, model, version, key)
            except E.HubError as e:
                log.warning("seed fetch of %s v%d %s failed: %s", model, version, key, e)
            finally:
                self._seeding.discard(job)

        threading.Thread(target=run, name="rlsync-seed-fetch", daemon=True).start()

    def _call(self, op: str, **kw):
        """A control call; if the hub no longer knows us (restart, failover), re-join and retry once.

        Afterwards `self._rpc.retried` says whether any try of this call may have reached a hub before
        the one that answered (a publish that committed on a hub that died before answering is then
        recognised), including tries before a re-join."""
        retried = False
        for attempt in range(3):
            seen = self._joins
            try:
                out = self._rpc.call(op, **kw)
            except E.NotJoinedError:
                retried = retried or self._rpc.retried
                # Another thread may have re-joined meanwhile (then the retry just works), or the hub
                # expired us again right after a re-join (a stalled, overloaded machine): re-join again.
                if self.worker_id is None or attempt == 2:
                    self._rpc.retried = retried
                    raise
                self._rejoin(self._rpc, seen)  # its own calls reset the channel's flag: ours is kept here
                continue
            except BaseException:
                self._rpc.retried = retried or self._rpc.retried
                raise
            self._rpc.retried = retried or self._rpc.retried
            return out
