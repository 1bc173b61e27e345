"""The hub server: one ZeroMQ ROUTER socket, one thread, the `HubState` machine, the journal.

It stores no tensor bytes. It answers joins, publishes, fetch plans (with signed tickets) and releases (one
waiting for in-flight reads to drain is answered later); a periodic tick expires silent workers.

    hub = start_embedded_hub()          # in-process, in one line; hub.address, hub.token
    python -m rlsync.hub serve --host 127.0.0.1 --port 5555 --token-file tok --journal hub.db
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass

import zmq

from rlsync.hub import errors as E
from rlsync.hub.server.journal import Journal
from rlsync.hub.server.known_manifests import KnownManifests
from rlsync.hub.model.location import Location
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.server.plan_replies import Packed, PlanReplies
from rlsync.hub.protocol.rpc import MAX_MESSAGE_BYTES, check_port, pack, read_or_create_token, wait_port_released
from rlsync.hub.server.annotations import AnnotationOps
from rlsync.hub.server.deltas import DeltaOps
from rlsync.hub.server.derived import DerivedOps
from rlsync.hub.server.home import HomeOps
from rlsync.hub.server.load import HubLoad, packed_map, park_until
from rlsync.hub.server.tenancy import TenantOps
from rlsync.hub.server.waits import DEFERRED as _DEFERRED, WaitOps
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import DONE, KEEP_OLD, PENDING, HubConfig, HubState
from rlsync.hub.state.records import HolderSilentError
from rlsync.hub.protocol.tickets import TicketSigner
from rlsync.hub.protocol.waker import Waker
from rlsync.hub.protocol.args import SPECS, check_args, manifest_from_wire

log = logging.getLogger(__name__)

TICK_S = 0.2
_MORE = int(zmq.SNDMORE)


class HubServer(DeltaOps, DerivedOps, WaitOps, TenantOps, AnnotationOps, HomeOps):
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, token: str, journal: str,
                 config: HubConfig | None = None) -> None:
        check_port(port, bind=True)  # ZeroMQ would listen on port % 65536 while the hub names `port`
        self.cfg = config or HubConfig()
        self.token = token
        self._init_tenants()  # credentials, scopes, quotas, shares (hub/server/tenancy.py): checked first
        self.journal = Journal(journal)
        self.signer = _ticket_signer(self.journal)
        # Ids carry the hub's epoch (restarts so far) so a restarted hub never reuses one.
        self.epoch = int(self.journal.get_meta("epoch") or 0) + 1
        self.journal.set_meta("epoch", self.epoch)
        self.state = HubState(self.cfg, commit_hook=self._journal_commit, id_prefix=f"{self.epoch}.")
        self._init_home()  # this hub's id, and the models it follows from their home hubs (hub/server/home.py)
        self._known = KnownManifests()  # the newest ones: what a re-join storm re-registers
        restored = []
        for model, version, group, manifests, _ in self.journal.load():
            parsed = {k: manifest_from_wire(m) for k, m in manifests.items()}
            self.state.restore_committed(model, version, group, parsed)
            restored.extend(parsed.values())
        for m in restored[-self._known.size:]:
            self._known.add(m)
        self._init_annotations()  # journaled ones re-attached to their restored versions
        # A restart: workers re-register replicas within a beat or two; till then "no holder" waits.
        self._grace_until = time.monotonic() + self.cfg.reregister_grace_s if restored else 0.0
        self._parked: list[tuple[bytes, object, str, dict, tuple[float, float]]] = []
        self._init_waits()  # wait_latest's parked replies (hub/server/waits.py)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if port == 0:
            port = self._sock.bind_to_random_port(f"tcp://{host}")
        else:
            self._sock.bind(f"tcp://{host}:{port}")
        self.address = f"tcp://{host}:{port}"
        self._waiting: dict[str, list[tuple[bytes, int]]] = {}
        self._stop, self._waker = threading.Event(), Waker()  # stop() wakes the poll at once, not at its tick
        self._thread: threading.Thread | None = None
        self.rpc_count = 0
        self.rpc_by_op: dict[str, int] = {}
        """Control RPCs served, by operation (`stats`' rpc_by_op; logged when the hub stops)."""
        self.load = HubLoad()
        self._plans = PlanReplies(self.signer, self.load, self.cfg.ticket_ttl_s, self._share_of)  # signed per pass
        self._manifest_bytes = self._plans.manifests
        self.bytes_in = 0
        self.bytes_out = 0

    def _journal_commit(self, model, version, group, manifests) -> None:
        self.journal.record_commit(model, version, group, manifests, time.time())
        self.journal.forget(model, below=version - self.state.retained_window(model) - KEEP_OLD)

    # ------------------------------------------------------------------ loop
    def serve_forever(self) -> None:
        log.info("hub serving on %s (journal %s)", self.address, self.journal.path)
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        next_tick = time.monotonic() + TICK_S
        try:
            while not self._stop.is_set():
                wake = min(next_tick, self.waits_due)  # a parked wait_latest is answered at its deadline
                events = dict(poller.poll(max(0, int((wake - time.monotonic()) * 1000))))
                if self._sock in events:
                    for _ in range(256):
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(frames)
                    self._flush_releases()
                    self._retry_parked()
                    self._plans.flush(self._reply)
                self._answer_waits()  # a commit in this pass, or a deadline passed
                if time.monotonic() >= next_tick:
                    self.load.tick(self.rpc_count)
                    self._expire()
                    self._flush_releases()
                    self._retry_parked()
                    self._plans.flush(self._reply)
                    next_tick = time.monotonic() + TICK_S
        finally:
            self._sock.close(0)
            self._waker.close()
            self.journal.close()  # checkpoints the WAL: a clean stop leaves the journal in one file
            log.info("hub on %s stopped; journal %s closed; control RPCs served by op: %s", self.address,
                     self.journal.path, dict(sorted(self.rpc_by_op.items())))

    def start(self) -> "HubServer":
        self._thread = threading.Thread(target=self.serve_forever, name="rlsync-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._waker.wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
            wait_port_released(self.address)  # stopped means the port is free: a restart on it binds

    # ------------------------------------------------------------------ requests
    def _reply(self, ident: bytes, rid, ok: bool, payload) -> None:
        if isinstance(payload, Packed):  # a result already in msgpack form (a plan: its manifest is cached)
            data = packed_map({"id": rid, "ok": ok}, {"result": payload})
        else:
            data = pack({"id": rid, "ok": ok, ("result" if ok else "error"): payload})
        self.bytes_out += len(data)
        sock = self._sock  # three sends with int flags: send_multipart's loop and enum flags took 5-9 us a reply
        sock.send(ident, _MORE)
        sock.send(b"", _MORE)
        sock.send(data, 0)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return
        ident, data = frames[0], frames[-1]
        self.bytes_in += len(data)
        rid = None
        try:
            msg = self._known.decode(data)  # unpack(data), a manifest the hub knows not decoded again
            if not isinstance(msg, dict):
                raise E.ProtocolError("control message must be a map")
            rid = msg.get("id")
            tenant = self._authenticate(msg.get("token"))
            op, args = msg.get("op"), msg.get("args")
            if not isinstance(op, str) or op not in SPECS:
                raise E.ProtocolError(f"unknown operation {op!r}")
            if args is not None and not isinstance(args, dict):
                raise E.InvalidArgumentError(f"{op}: args must be a map")
            args = check_args(op, args or {})
            self._authorize(tenant, op, args)  # scopes, worker ownership, quota: before any handler
            self.rpc_count += 1
            self.rpc_by_op[op] = self.rpc_by_op.get(op, 0) + 1
        except E.HubError as e:
            self._reply(ident, rid, False, [e.code, str(e)])
            return
        except Exception as e:  # never let one request kill the hub
            log.exception("hub: internal error")
            self._reply(ident, rid, False, ["hub_error", f"internal error: {type(e).__name__}: {e}"])
            return
        self._run(ident, rid, getattr(self, f"op_{op}"), op, args, park_until(msg.get("wait_s")))

    def _run(self, ident: bytes, rid, handler, op: str, args: dict, until: tuple[float, float]) -> None:
        """`until`: (since, deadline) of a request that may be parked: answered by the deadline, which
        leaves the caller's try time to hear the answer (`park_until`)."""
        try:
            try:
                result = handler(ident, rid, **args)
            except (E.VersionLostError, E.VersionNotRetainedError) as e:
                silent = isinstance(e, HolderSilentError)  # a stalled source may be back within a heartbeat
                now = time.monotonic()
                if not silent and (op not in ("fetch", "replan") or now >= self._grace_until):
                    raise
                if now >= until[1]:
                    raise E.HolderWaitTimeoutError(f"{op}: waited {now - until[0]:.1f}s for a holder to be heard "
                                                   f"from, the caller's time for one try: {e}") from None
                self._parked.append((ident, rid, op, args, until))  # answered when a holder re-registers
                return
            if result is not _DEFERRED:
                self._reply(ident, rid, True, result)
        except E.HubError as e:
            self._reply(ident, rid, False, [e.code, str(e)])
        except Exception as e:  # never let one request kill the hub (a bug: check_args let it through)
            log.exception("hub: internal error")
            self._reply(ident, rid, False, ["hub_error", f"internal error: {type(e).__name__}: {e}"])

    def _expire(self) -> None:
        """Expire silent workers. One that held a full replica may only have been slow (a stalled or
        overloaded machine): for `reregister_grace_s` a fetch that finds no holder waits (parked) for
        it to re-join and re-register, as after a restart, before the hub answers lost."""
        dead = self.state.silent_workers()
        if not dead:
            return
        held = any(self.state.holds_full(w) for w in dead)
        self.state.expire(dead)
        if held:
            self._grace_until = max(self._grace_until, time.monotonic() + self.cfg.reregister_grace_s)

    def _retry_parked(self) -> None:
        """Plan parked fetches again: a holder may have re-registered, or the grace ran out (then the
        caller gets the lost / not-retained answer it was spared until now)."""
        if not self._parked:
            return
        parked, self._parked = self._parked, []
        for ident, rid, op, args, until in parked:
            self._run(ident, rid, getattr(self, f"op_{op}"), op, args, until)

    def _flush_releases(self) -> None:
        for rep, outcome in self.state.poll_releases().items():
            for ident, rid in self._waiting.pop(rep, []):
                self._reply(ident, rid, True, str(outcome))
        for rep in [r for r in self._waiting if r not in self.state.pending_releases]:
            for ident, rid in self._waiting.pop(rep):
                self._reply(ident, rid, True, str(DONE))

    # ------------------------------------------------------------------ operations
    def op_ping(self, ident, rid):
        return {"time": time.time()}

    # Handlers get arguments already checked and typed by `wire_args.check_args` (Shard, Location,
    # Manifest objects; ints in range); a semantic refusal is the state machine's typed error.
    def op_join(self, ident, rid, name: str, location: Location, endpoint: dict, worker_id: str | None = None,
                role: str = "worker", follow: bool = False):
        wid = self.state.join(name, location, endpoint, worker_id, role, follow)
        self._joined(wid)
        log.info("worker %s (%s) joined at %s", wid, name, location)
        return {"wid": wid, "ticket_key": self.signer.public_bytes,
                "worker_timeout_s": self.cfg.worker_timeout_s, "hub_id": self.hub_id}

    def op_heartbeat(self, ident, rid, wid: str):
        """{"drops", "tasks"} when there is something to say; nil when not (most beats, some across a DC link)."""
        self.state.touch(wid)
        drops, tasks = self.state.drops_for(wid), self.state.tasks_for(wid)
        return {"drops": drops, "tasks": tasks} if drops or tasks else None

    def op_leave(self, ident, rid, wid: str):
        self.state.touch(wid)
        return {"dropped": self.state.remove_worker(wid)}

    def op_register(self, ident, rid, wid: str, model: str, version: int, shard: Shard, slot: str,
                    manifest: Manifest, origin: bool = False):
        return self.state.register_replica(wid, model, version, shard, slot, manifest, origin=origin)

    def op_fetch(self, ident, rid, wid: str, model: str, version, shard: Shard, group=None, into_spec=None,
                 have_manifests=None, relay: bool = True):
        t0 = time.perf_counter()
        plan = self.state.plan_fetch(wid, model, version, shard, group, into_spec, relay=relay)
        return self._plan_reply(ident, rid, wid, plan, t0, have_manifests)

    def op_replan(self, ident, rid, wid: str, fetch_id: str, failed: list, units: list, gone: list = ()):
        t0 = time.perf_counter()  # the reader has the manifest since its fetch: a re-plan never resends it
        return self._plan_reply(ident, rid, wid, self.state.replan(wid, fetch_id, failed, units, gone), t0,
                                with_manifest=False)

    def _plan_reply(self, ident, rid, wid: str, plan, t0: float, have: frozenset | None = None,
                    with_manifest: bool = True):
        """Queued: answered with the other plans of this loop pass, their tickets under one signature."""
        key = self.state.workers[wid].endpoint["reader_key"]  # join checked it is there
        self._plans.add(ident, rid, wid, key, plan, t0, have, with_manifest)
        return _DEFERRED

    def _plan_fields(self, wid: str, plan) -> dict:
        """A plan as a map, its tickets signed now (delta_choose's first plan; fetch plans are batched)."""
        return self._plans.fields(wid, self.state.workers[wid].endpoint["reader_key"], plan)  # join checked the key

    def op_fetch_done(self, ident, rid, wid: str, fetch_id: str, ok: bool):
        self.state.fetch_done(wid, fetch_id, ok)
        return True

    def op_release(self, ident, rid, wid: str, model: str, version: int, shard: Shard, slot: str = "live",
                   handoff: bool = False):
        outcome = self.state.release(wid, model, version, shard, slot, handoff)
        if outcome is PENDING:
            rep = ReplicaId(wid, model, version, shard.key, slot).wire
            self._waiting.setdefault(rep, []).append((ident, rid))
            return _DEFERRED
        return str(outcome)

    def op_latest(self, ident, rid, model: str):
        return self.state.model(model).latest

    def op_versions(self, ident, rid, model: str):
        m = self.state.model(model)
        held = self.state.held_versions(model)
        return {"latest": m.latest, "committed": list(m.committed),
                "retained": sorted(v for v in m.versions if self.state.is_retained(model, v)),
                "held": sorted(held)}

    def op_stats(self, ident, rid):
        s = self.state.stats()
        s["models"] = {m: s["models"][m] for m in self._visible(s["models"])}
        s.update(rpc_count=self.rpc_count, rpc_by_op=dict(self.rpc_by_op), rpc_bytes_in=self.bytes_in,
                 rpc_bytes_out=self.bytes_out)
        s.update(self.load.snapshot(self.rpc_count, [w.last_seen for w in self.state.workers.values()],
                                    self.state.clock()))
        return s


KEY_SUFFIX = ".ticket-key"


def _ticket_signer(journal: Journal) -> TicketSigner:
    """The ticket-signing key lives in `<journal>.ticket-key` (0600, created with O_EXCL), never in
    the journal. A journal from before that keeps its key in `meta`: move it out and scrub it."""
    path = journal.path + KEY_SUFFIX
    legacy = journal.get_meta("ticket_key")
    if legacy is not None and not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(legacy)
            f.flush()
            os.fsync(f.fileno())
    if legacy is not None:
        journal.scrub_meta("ticket_key")
    return TicketSigner.from_key_file(path)


@dataclass
class EmbeddedHub:
    """A hub running in a thread of this process."""

    server: HubServer
    address: str
    token: str

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_embedded_hub(*, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                       journal: str | None = None, config: HubConfig | None = None) -> EmbeddedHub:
    """Start a hub in a background thread of this process and return its address and token."""
    import secrets
    token = token or secrets.token_hex(24)
    if journal is None:
        journal = os.path.join(tempfile.mkdtemp(prefix="rlsync-hub-"), "journal.db")
    server = HubServer(host=host, port=port, token=token, journal=journal, config=config).start()
    return EmbeddedHub(server, server.address, token)


def serving_gc() -> None:
    """GC thresholds for a hub process. Its tables hold ~10^5 long-lived records at 10k workers, and
    every message it unpacks allocates hundreds of containers (thousands for a manifest): with Python's
    defaults (700, 10, 10) the collector took ~3/4 of the CPU of unpacking a 1,000-unit manifest.
    Only the standalone server sets this (an embedded hub leaves its host process's GC alone)."""
    gc.set_threshold(10_000, 50, 100)


def serve_main(host: str, port: int, token_file: str, journal: str, config: HubConfig | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop cleanly: the loop ends within one tick, the journal is checkpointed
    and closed, the process exits 0. A restart on the same journal resumes as after a kill -9 (re-registration)."""
    token = read_or_create_token(token_file)
    serving_gc()
    server = HubServer(host=host, port=port, token=token, journal=journal, config=config)

    def stop(signum, _frame) -> None:
        log.info("hub: %s received; stopping", signal.Signals(signum).name)
        server._stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"rlsync hub listening on {server.address}", flush=True)
    server.serve_forever()
