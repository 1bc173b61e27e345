"""`tcp`: unit bytes through TCP, moved by the native engine `rlsync._engine` (csrc/engine.cpp).

Same wire format and serve loop as `tcp-py` (hub/dataplane/transfer.py does framing, tickets, relay waits);
what changes is who moves the bytes. The server sends a unit's header and every segment in one
GIL-free `sendmsg` over an iovec straight from the source tensors; the reader receives straight
into its registered buffers with the GIL released and hashes each piece with xxh3 while it is
still in cache, handing the digest back so the unit is not read a second time to verify it.
Several of these streams run in parallel per source (`DataPlaneConfig.streams`).

The reader chooses the send mode per request (`zero_copy`, from the data-path calibration in
rlsync.hub.dataplane.tuning): which one is faster differs between machines (docs/performance.md).
After the last unit the reader sends one "done" byte and the server waits for it before the read
counts as drained, so `release` returns only once the reader holds every byte. That is what makes
zero-copy (the default) safe: the kernel reads the source pages by reference
(vmsplice/splice) until the reader has consumed them, and nothing may change that memory before
then. A read that fails on the server's side aborts the connection (RST), which drops the kernel's
references at once instead of leaving them in a lingering socket. Measured: docs/performance.md.

When the extension is not built, `tcp` reports itself unavailable (with the reason, logged once)
and readers pick `tcp-py` instead.
"""
from __future__ import annotations

import logging
import socket
import struct

from rlsync.hub.dataplane.wire import OK, UNIT
from rlsync.hub.errors import ProtocolError, TransportUnavailableError
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.messages import Endpoint
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, register_transport

log = logging.getLogger(__name__)

try:
    from rlsync import _engine
    _MISSING = ""
except ImportError as e:  # the optional extension did not build (no compiler?) or was removed
    _engine = None
    _MISSING = (f"native engine rlsync._engine is not built ({e}); rebuild it with "
                "`scripts/run pip install -e . --no-deps` (needs a C++17 compiler)")
_warned = False


def _timeout_ms(conn: socket.socket) -> int:
    t = conn.gettimeout()
    return -1 if t is None else max(1, int(t * 1000))


def _abort_on_close(conn: socket.socket) -> None:
    """Make the coming close() reset the connection: queued data (spliced source pages) is dropped
    at once rather than kept for a peer that will not read it."""
    try:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass


def _segments(rep: LocalReplica, u: int) -> list[tuple[int, int]]:
    return [(rep.addresses[ti] + off, ln) for ti, off, ln in rep.manifest.units[u].segments]


@register_transport("tcp")
class NativeTcpTransport(Transport):
    kind = 3
    priority = 20
    max_streams = 64
    zero_copy: bool = True
    """Splice the source pages into the socket by reference instead of copying them (no sending-side
    copy; the pages are read until the reader's "done"). False: copy with sendmsg. The reader sets it
    and asks for it in its request; the server's instance takes it from the request."""

    @classmethod
    def check_available(cls) -> None:
        global _warned
        if _engine is None:
            if not _warned:
                _warned = True
                log.warning("transport 'tcp' unavailable, falling back to 'tcp-py': %s", _MISSING)
            raise TransportUnavailableError(_MISSING)

    def open_request(self, dest: LocalReplica, peer: Endpoint) -> dict | None:
        return None if self.zero_copy else {"zc": False}  # absent: zero-copy, as before this field

    def accept_request(self, extra, rep: LocalReplica) -> None:
        if extra is not None and not (isinstance(extra, dict) and set(extra) <= {"zc"}
                                      and isinstance(extra.get("zc", True), bool)):
            raise ProtocolError("malformed tcp request options: expected {'zc': bool}")
        self.zero_copy = True if extra is None else extra.get("zc", True)

    def send_unit(self, conn: socket.socket, rep: LocalReplica, u: int) -> int:
        nbytes = rep.manifest.units[u].nbytes
        try:
            _engine.send_frame(conn.fileno(), UNIT.pack(u, OK, nbytes), _segments(rep, u), _timeout_ms(conn),
                               self.zero_copy)
        except BaseException:
            _abort_on_close(conn)
            raise
        return nbytes

    def recv_unit(self, conn: socket.socket, dest: LocalReplica, u: int, nbytes: int, peer: Endpoint) -> int:
        unit = dest.manifest.units[u]
        if nbytes != unit.nbytes:
            raise ProtocolError(f"unit {u}: source announced {nbytes} bytes, manifest says {unit.nbytes}")
        return _engine.recv_segments(conn.fileno(), _segments(dest, u), _timeout_ms(conn), True)

    def finish(self, conn: socket.socket) -> None:
        conn.sendall(b"\x01")  # done: every byte is in the reader's memory, none still in flight

    def wait_finish(self, conn: socket.socket) -> None:
        # Until the reader's "done", spliced pages may still be read by the kernel: the read is
        # not drained (and the replica not released) before it.
        try:
            recv_exact(conn, memoryview(bytearray(1)))
        except BaseException:
            _abort_on_close(conn)
            raise
