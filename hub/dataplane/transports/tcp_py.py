"""`tcp-py`: unit bytes through the TCP socket, in pure Python (memoryview + sendall / recv_into).

The portable path, and the fallback when the native engine is unavailable. Sends each segment
straight from the source tensor's memory and receives straight into the reader's buffers.
"""
from __future__ import annotations

import socket

from rlsync.hub.dataplane.wire import OK, UNIT
from rlsync.hub.errors import ProtocolError
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.messages import Endpoint
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, register_transport


@register_transport("tcp-py")
class PyTcpTransport(Transport):
    kind = 1
    priority = 10

    def send_unit(self, conn: socket.socket, rep: LocalReplica, u: int) -> int:
        unit = rep.manifest.units[u]
        conn.sendall(UNIT.pack(u, OK, unit.nbytes))
        for ti, off, ln in unit.segments:
            conn.sendall(rep.views[ti][off:off + ln])
        return unit.nbytes

    def recv_unit(self, conn: socket.socket, dest: LocalReplica, u: int, nbytes: int, peer: Endpoint) -> None:
        unit = dest.manifest.units[u]
        if nbytes != unit.nbytes:
            raise ProtocolError(f"unit {u}: source announced {nbytes} bytes, manifest says {unit.nbytes}")
        for ti, off, ln in unit.segments:
            recv_exact(conn, dest.views[ti][off:off + ln])
