"""The data plane every worker runs: a server for the replicas it holds, and the reader side.

One TCP listener per worker. A reader connects once per (fetch, source), sends one request —
ticket, replica id, the list of units it wants — and the server streams the units back in that
order (pipelined: no round trip per unit). For a relay replica a unit not yet present makes the
server wait on the replica's condition variable, so a chain of readers forwards units as they land.
The request framing, ticket check, relay wait and drain accounting live here, once; how a unit's
bytes travel (through the socket, or read straight from the source's memory) is the transport's.
Frame layouts: `rlsync.hub.dataplane.wire`.
"""
from __future__ import annotations

import logging
import socket
import threading
import time

import msgpack

from rlsync.hub import errors as E
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.dataplane.wire import ERR, MAGIC, MAX_REQUEST_BYTES, OK, REQ, UNIT, WHOLE
from rlsync.hub.model.manifest import unit_checksum
from rlsync.hub.dataplane.shares import ShareScheduler
from rlsync.hub.dataplane.store import LocalReplica, ReplicaStore
from rlsync.hub.protocol.tickets import ReaderKey, ReplayGuard, TicketVerifier
from rlsync.hub.protocol.messages import Endpoint
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, transport_by_kind

log = logging.getLogger(__name__)



def send_error(conn: socket.socket, unit: int, err: E.HubError) -> None:
    payload = msgpack.packb([err.code, str(err)])
    try:
        conn.sendall(UNIT.pack(unit, ERR, len(payload)) + payload)
    except OSError:
        pass


class DataServer:
    def __init__(self, store: ReplicaStore, cfg: DataPlaneConfig) -> None:
        self.store, self.cfg = store, cfg
        self.worker_id: str | None = None
        self.verifier: TicketVerifier | None = None
        self.replays = ReplayGuard()
        self.shares = ShareScheduler(cfg.share_slots)  # tenants' reads by weight (hub/dataplane/shares.py)
        self._lsock = socket.create_server((cfg.host, 0))
        self._lsock.settimeout(0.5)
        self.port = self._lsock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="rlsync-data", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.cfg.host}:{self.port}"

    def close(self) -> None:
        self._stop.set()
        try:
            self._lsock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept now (not at its 0.5 s timeout)
        except OSError:
            pass
        self._thread.join(timeout=2)
        self._lsock.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._lsock.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), name="rlsync-data-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self.cfg.io_timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            rep, transport, units, share = self._accept_request(conn)
        except E.HubError as e:
            log.warning("data plane: refused a request: %s", e)
            send_error(conn, WHOLE, e)
            conn.close()
            return
        except (OSError, ConnectionError):
            conn.close()
            return
        try:
            self._serve_units(conn, rep, transport, units, share)
        finally:
            transport.close()

    def _serve_units(self, conn: socket.socket, rep: LocalReplica, transport: Transport, units: list[int],
                     share: tuple[str, float] | None = None) -> None:
        sent_units = sent_bytes = 0
        rep.begin_read()
        try:
            for u in units:
                if self.cfg.serve_delay_s:
                    time.sleep(self.cfg.serve_delay_s)
                try:
                    rep.wait_unit(u, self.cfg.relay_wait_s)
                except E.TransferError as e:
                    send_error(conn, u, e)
                    return
                if share is None:
                    sent_bytes += transport.send_unit(conn, rep, u)
                else:  # a tenant's read: wait for its weighted turn at this source
                    self.shares.acquire(share[0], share[1], rep.manifest.units[u].nbytes)
                    try:
                        sent_bytes += transport.send_unit(conn, rep, u)
                    finally:
                        self.shares.release(share[0])
                sent_units += 1
            transport.wait_finish(conn)
        except (OSError, ConnectionError) as e:
            log.info("data plane: reader of %s went away: %s", rep.id, e)
        finally:
            rep.end_read(sent_units, sent_bytes)
            conn.close()

    def _accept_request(self, conn: socket.socket) -> tuple[LocalReplica, Transport, list[int], tuple | None]:
        head = bytearray(REQ.size)
        recv_exact(conn, memoryview(head))
        magic, proto, kind, _, body_len = REQ.unpack(head)
        if magic != MAGIC or proto != 1:
            raise E.ProtocolError("not an rlsync data-plane request")
        if body_len > MAX_REQUEST_BYTES:
            raise E.ProtocolError(f"request of {body_len} bytes exceeds {MAX_REQUEST_BYTES}")
        body = bytearray(body_len)
        recv_exact(conn, memoryview(body))
        try:  # {"req": packed request, "proof": the reader's signature of it} (rlsync.hub.protocol.tickets)
            outer = msgpack.unpackb(bytes(body), raw=False)
            signed, proof = (outer["req"], outer.get("proof")) if isinstance(outer, dict) and "req" in outer \
                else (bytes(body), None)
            msg = msgpack.unpackb(signed, raw=False)
            ticket, replica_id, units = msg["ticket"], str(msg["replica"]), list(msg["units"])
        except Exception:
            raise E.ProtocolError("malformed data-plane request body") from None
        cls = transport_by_kind(kind)
        if cls is None or not cls.is_available():
            raise E.TransportUnavailableError(f"transport kind {kind} is not served here")
        if self.verifier is None or self.worker_id is None:
            raise E.TicketError("this data-plane server has not joined a hub yet")
        t = self.verifier.verify(ticket, source=self.worker_id, replica=replica_id)
        self.replays.check(t, signed, proof, msg.get("nonce"))
        rep = self.store.get_or_wait(replica_id, self.cfg.register_wait_s)
        if rep is None:
            raise E.TicketError(f"replica {replica_id} is not held here (released)")
        n = len(rep.manifest.units)
        if len(units) > n or any(not isinstance(u, int) or not 0 <= u < n for u in units):
            raise E.ProtocolError(f"unit ids must be distinct ints in [0, {n})")
        if len(set(units)) != len(units):
            raise E.ProtocolError("duplicate unit ids in request")
        transport = cls()
        try:
            transport.accept_request(msg.get("x"), rep)
        except BaseException:
            transport.close()
            raise
        return rep, transport, units, t.share


def read_from_source(transport: Transport, endpoint: Endpoint, ticket: bytes, replica_id: str,
                     units: list[int], dest: LocalReplica, io_timeout_s: float, on_unit=None,
                     streams: int = 1, *, reader: ReaderKey) -> int:
    """Pull `units` of `replica_id` from the server at `endpoint` into `dest`, verifying each.

    Marks each verified unit present in `dest` (so `dest` relays it on at once). Returns bytes read.
    Raises TicketError / TransferError / ChecksumError / ProtocolError; never leaves a unit marked
    present whose bytes did not verify. `reader` is this reader's session key, the one the hub put
    in `ticket`: each request is signed with it, with a fresh nonce. With `streams` > 1 (up to the transport's `max_streams`)
    the units are striped round-robin over that many connections, each its own ticket-checked
    request, so units still land roughly in order for relays downstream.
    """
    k = max(1, min(streams, transport.max_streams, len(units)))
    if k == 1:
        return _read_stream(transport, endpoint, ticket, replica_id, units, dest, io_timeout_s, on_unit, reader)
    got, errors = [0] * k, []

    def one(i: int) -> None:
        try:
            got[i] = _read_stream(transport, endpoint, ticket, replica_id, units[i::k], dest,
                                  io_timeout_s, on_unit, reader)
        except BaseException as e:  # noqa: BLE001 - re-raised below on the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,), name="rlsync-stream", daemon=True) for i in range(1, k)]
    for t in threads:
        t.start()
    one(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(got)


def _read_stream(transport: Transport, endpoint: Endpoint, ticket: bytes, replica_id: str,
                 units: list[int], dest: LocalReplica, io_timeout_s: float, on_unit, reader: ReaderKey) -> int:
    host, port = endpoint.tcp.rsplit(":", 1)
    nbytes = 0
    try:
        conn = socket.create_connection((host, int(port)), timeout=io_timeout_s)
    except ConnectionRefusedError:
        raise E.SourceGoneError(f"source {endpoint.tcp} refused the connection: nobody listens there") from None
    except OSError as e:
        raise E.TransferError(f"cannot reach data plane at {endpoint.tcp}: {e}") from None
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = reader.sign_request(ticket, replica_id, units, transport.open_request(dest, endpoint))
        conn.sendall(REQ.pack(MAGIC, 1, transport.kind, 0, len(body)) + body)
        head = bytearray(UNIT.size)
        for u in units:
            recv_exact(conn, memoryview(head))
            got, status, n = UNIT.unpack(head)
            if status == ERR:
                if n > MAX_REQUEST_BYTES:
                    raise E.ProtocolError("oversized error frame")
                payload = bytearray(n)
                recv_exact(conn, memoryview(payload))
                try:
                    code, text = msgpack.unpackb(bytes(payload))
                except Exception:
                    raise E.ProtocolError(f"malformed error frame from {endpoint.tcp}") from None
                raise E.error_from_code(str(code), f"source {endpoint.tcp}: {text}")
            unit = dest.manifest.units[u]
            if got != u or status != OK:
                raise E.ProtocolError(f"expected unit {u}, source sent {got} (status {status})")
            digest = transport.recv_unit(conn, dest, u, n, endpoint)
            if digest is None:
                digest = unit_checksum(dest.views, unit)
            if digest != unit.checksum:
                raise E.ChecksumError(f"unit {u} from {endpoint.tcp} failed its checksum: discarded")
            dest.mark_present(u)
            nbytes += unit.nbytes
            if on_unit is not None:
                on_unit(u)
        transport.finish(conn)
    except (socket.timeout, TimeoutError):
        raise E.TransferError(f"source {endpoint.tcp} stalled for {io_timeout_s}s") from None
    except (ConnectionError, OSError) as e:
        if refuses(host, port, tries=4):  # the connection broke and nobody listens there now: the source died
            raise E.SourceGoneError(f"source {endpoint.tcp} died mid-transfer ({e}); its port now refuses "
                                    "connections") from None
        raise E.TransferError(f"source {endpoint.tcp} failed mid-transfer: {e}") from None
    finally:
        transport.close()
        conn.close()
    return nbytes


def refuses(host: str, port: str | int, timeout_s: float = 1.0, tries: int = 1, gap_s: float = 0.05) -> bool:
    """Does `host:port` refuse a connection (nobody listens: proof the server is gone)? A timeout or
    any other error is not proof (a stalled or unreachable peer). `tries` > 1 asks again `gap_s` apart:
    a process being killed closes its connections and its listener one after the other."""
    for i in range(tries):
        if i:
            time.sleep(gap_s * i)
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                pass
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False
