"""`shm`: same-host reads straight out of the source's memory (Linux cross-memory attach).

On one host the fastest path needs no socket for the bytes and no staging segment: the server
announces where a present unit lives in its address space, and the reader copies it into its own
buffers with `process_vm_readv` — one copy, like an RDMA READ, and the source tensors need not be
allocated in shared memory (publish stays zero-copy). The TCP connection still carries the
request, the ticket check, relay waits and the final "done" that lets the source count the read
as drained.

With the native engine built, the copy and the unit's xxh3 run in one GIL-free pass
(`rlsync._engine.read_process`, hashing each 256 KiB while hot), so several streams per source
copy in parallel; without it, ctypes copies and Python hashes, one stream.

We chose this over a POSIX shared-memory staging ring (copy in, copy out: two copies, and buffers
to size) — see docs/transports.md. It needs the reader to be allowed to ptrace the source (same
user under Yama ptrace_scope 0, or CAP_SYS_PTRACE); `check_available` says so when it is not.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import socket

import msgpack

from rlsync.hub.dataplane.wire import OK, UNIT
from rlsync.hub.errors import ProtocolError, TransferError, TransportUnavailableError
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.messages import Endpoint
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, register_transport

try:
    from rlsync import _engine
    if not hasattr(_engine, "read_process"):  # built before read_process existed: rebuild to get it
        _engine = None
        logging.getLogger(__name__).warning(
            "rlsync._engine predates read_process: shm copies with ctypes and hashes in Python on one "
            "stream (~2x slower here); rebuild it with `scripts/run pip install -e . --no-deps -q`")
except ImportError:  # the native engine is optional: ctypes copy, Python hash, one stream
    _engine = None


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_readv = getattr(_libc, "process_vm_readv", None)
if _readv is not None:
    _readv.restype = ctypes.c_ssize_t
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                       ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]


def _ptrace_scope() -> int:
    try:
        return int(open("/proc/sys/kernel/yama/ptrace_scope").read())
    except (OSError, ValueError):
        return 0  # no Yama: same-user ptrace allowed


def copy_from_process(pid: int, remote: int, local: int, n: int) -> None:
    """Copy n bytes at address `remote` in process `pid` to `local` in this process."""
    done = 0
    while done < n:
        liov = _IoVec(local + done, n - done)
        riov = _IoVec(remote + done, n - done)
        got = _readv(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise TransferError(f"process_vm_readv from pid {pid} failed: {os.strerror(err)}")
        if got == 0:
            raise TransferError(f"process_vm_readv from pid {pid} made no progress")
        done += got


@register_transport("shm")
class SharedMemoryTransport(Transport):
    kind = 2
    priority = 30
    max_streams = 8 if _engine is not None else 1

    @classmethod
    def check_available(cls) -> None:
        if _readv is None:
            raise TransportUnavailableError("shm transport needs Linux process_vm_readv (libc has none)")
        if _ptrace_scope() >= 2 and os.geteuid() != 0:
            raise TransportUnavailableError(
                "shm transport needs ptrace rights over peer processes: "
                "/proc/sys/kernel/yama/ptrace_scope is >= 2 and we are not root")

    def usable_between(self, mine: Endpoint, peer: Endpoint) -> bool:
        return super().usable_between(mine, peer) and mine.same_host(peer)

    def send_unit(self, conn: socket.socket, rep: LocalReplica, u: int) -> int:
        unit = rep.manifest.units[u]
        where = msgpack.packb([[rep.addresses[ti] + off, ln] for ti, off, ln in unit.segments])
        conn.sendall(UNIT.pack(u, OK, len(where)) + where)
        return unit.nbytes

    def recv_unit(self, conn: socket.socket, dest: LocalReplica, u: int, nbytes: int, peer: Endpoint) -> int | None:
        if nbytes > 1 << 20:
            raise ProtocolError("oversized shm address frame")
        body = bytearray(nbytes)
        recv_exact(conn, memoryview(body))
        unit = dest.manifest.units[u]
        segs = msgpack.unpackb(bytes(body))
        if len(segs) != len(unit.segments):
            raise ProtocolError(f"unit {u}: source announced {len(segs)} segments, manifest has {len(unit.segments)}")
        pieces = []
        for (ti, off, ln), (addr, n) in zip(unit.segments, segs):
            if n != ln:
                raise ProtocolError(f"unit {u}: segment of {n} bytes, manifest says {ln}")
            pieces.append((int(addr), dest.addresses[ti] + off, ln))
        if _engine is not None:
            try:
                return _engine.read_process(peer.pid, pieces, True)
            except OSError as e:
                raise TransferError(f"process_vm_readv from pid {peer.pid} failed: {e}") from None
        for addr, local, ln in pieces:
            copy_from_process(peer.pid, addr, local, ln)
        return None

    def finish(self, conn: socket.socket) -> None:
        conn.sendall(b"\x01")  # done: the source may count this read as drained

    def wait_finish(self, conn: socket.socket) -> None:
        recv_exact(conn, memoryview(bytearray(1)))
