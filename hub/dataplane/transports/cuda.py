"""The `cuda_ipc` transport: same-host reads between processes, device to device.

NOT EXECUTED ON A GPU. The machines this was written on have no GPU and a CPU-only torch: here
`cuda_ipc` reports itself unavailable. What ran here is the pure logic (cuda_logic.py) and the
transport's frames over a fake device (docs/transports.md).

GPU memory as a replica (the pinned host mirrors every other transport serves, and the checks of
CUDA tensors) is not this file's job: rlsync.hub.dataplane.device. This transport moves those
replicas' bytes without the host round trip. The server sends, per tensor and once per connection,
the CUDA IPC handle of the allocation (`UntypedStorage._share_cuda_()`), then per unit only
(tensor, offset, length). The reader opens the allocation and copies device -> device into its own
CUDA tensor, then device -> its pinned mirror so the unit is verified like any other (a GPU-side
hash would save that copy). Host-resident source tensors travel inline.

The mutability contract is the one of every transport: the source counts the read drained only
after the reader's "done" byte, so a release cannot free or overwrite memory a reader still maps.
"""
from __future__ import annotations

import logging
import os
import socket

import msgpack
import torch

from rlsync.hub.dataplane import device as D
from rlsync.hub.dataplane.wire import OK, UNIT
from rlsync.hub.errors import ProtocolError, TransportUnavailableError
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.messages import Endpoint
from rlsync.hub.dataplane.transports import cuda_logic as C
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, register_transport

log = logging.getLogger(__name__)


def share_handle(t: torch.Tensor) -> C.IpcHandle:
    """The CUDA IPC handle of the allocation holding `t` (what torch.multiprocessing sends)."""
    st = t.untyped_storage()
    dev, handle, size, off, rch, rco, ev, sync = st._share_cuda_()
    return C.IpcHandle(int(dev), bytes(handle), int(size), int(off), bytes(rch), int(rco), bytes(ev or b""),
                       bool(sync), t.data_ptr() - st.data_ptr())


def open_handle(h: C.IpcHandle) -> torch.Tensor:
    """Open a peer's allocation; a uint8 tensor over the bytes of the shared tensor."""
    st = torch.UntypedStorage._new_shared_cuda(h.device, h.handle, h.size_bytes, h.offset_bytes,
                                               h.ref_counter_handle, h.ref_counter_offset,
                                               h.event_handle or None, h.event_sync_required)
    whole = torch.empty(0, dtype=torch.uint8, device=f"cuda:{h.device}").set_(st)
    return whole[h.tensor_offset:]


@register_transport("cuda_ipc")
class CudaIpcTransport(Transport):
    kind = 6
    priority = 40
    """Above shm on one host: device-to-device copies need no host round trip."""

    def __init__(self) -> None:
        self._book = C.HandleBook()
        self._opened: dict[int, torch.Tensor] = {}

    @classmethod
    def check_available(cls) -> None:
        why = D.unavailable_reason()
        if why:
            raise TransportUnavailableError(why.replace("cuda:", "cuda_ipc:", 1))

    @classmethod
    def endpoint_info(cls) -> dict:
        """The GPUs this worker sees (for the planner's device labels)."""
        if D.unavailable_reason():
            return {}
        return {"cuda": {"devices": torch.cuda.device_count(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}}

    def usable_between(self, mine: Endpoint, peer: Endpoint) -> bool:
        # IPC handles cannot be opened by the process that exported them.
        return super().usable_between(mine, peer) and mine.same_host(peer) and mine.pid != peer.pid

    def send_unit(self, conn: socket.socket, rep: LocalReplica, u: int) -> int:
        unit = rep.manifest.units[u]
        dev = getattr(rep, "device_tensors", {})
        names = [s.name for s in rep.manifest.tensors]

        def on_gpu(ti: int) -> bool:
            t = dev.get(names[ti])
            return t is not None and D.is_gpu(t)

        parts = C.encode_frame(unit.segments, on_gpu, lambda ti: share_handle(dev[names[ti]]), self._book,
                               lambda ti, off, ln: rep.views[ti][off:off + ln])
        conn.sendall(UNIT.pack(u, OK, sum(len(p) for p in parts)))
        for p in parts:
            conn.sendall(p)
        return unit.nbytes

    def recv_unit(self, conn: socket.socket, dest: LocalReplica, u: int, nbytes: int, peer: Endpoint) -> None:
        head = bytearray(C.HEADER.size)
        recv_exact(conn, memoryview(head))
        (hlen,) = C.HEADER.unpack(head)
        if hlen > C.MAX_HEADER or hlen + C.HEADER.size > nbytes:
            raise ProtocolError("oversized or truncated cuda_ipc frame header")
        body = bytearray(hlen)
        recv_exact(conn, memoryview(body))
        try:
            msg = msgpack.unpackb(bytes(body), strict_map_key=False)
        except Exception:
            raise ProtocolError(f"unit {u}: undecodable cuda_ipc frame") from None
        unit = dest.manifest.units[u]
        segs, new = C.decode_header(msg, unit.segments, self._opened)
        if C.HEADER.size + hlen + C.inline_total(segs) != nbytes:
            raise ProtocolError(f"unit {u}: cuda_ipc frame length {nbytes} does not match its segments")
        for ti, h in new.items():
            self._opened[ti] = open_handle(h)
        dev = getattr(dest, "device_tensors", {})
        all_on_device = True
        for s in segs:
            if s.kind == C.INLINE:
                recv_exact(conn, dest.views[s.tensor][s.offset:s.offset + s.length])
                all_on_device = False
                continue
            src = self._opened[s.tensor][s.offset:s.offset + s.length]
            name = dest.manifest.tensors[s.tensor].name
            host = D.bytes_of(dest.tensors[name])[s.offset:s.offset + s.length]
            target = dev.get(name)
            if target is not None and D.is_gpu(target):
                D.bytes_of(target)[s.offset:s.offset + s.length].copy_(src)  # device -> device
                host.copy_(D.bytes_of(target)[s.offset:s.offset + s.length])  # -> mirror, to verify
            else:
                host.copy_(src)
                all_on_device = False
        D.sync()
        if isinstance(dest, D.DeviceReplica) and all_on_device:
            dest.on_device[u] = True  # mark_present need not copy it up again
        return None

    def finish(self, conn: socket.socket) -> None:
        conn.sendall(b"\x01")

    def wait_finish(self, conn: socket.socket) -> None:
        recv_exact(conn, memoryview(bytearray(1)))

    def close(self) -> None:
        self._opened.clear()  # frees the opened storages: cudaIpcCloseMemHandle

