"""GPU memory in the hub: CUDA tensors as replicas and fetch targets, and the `cuda_ipc` transport.

NOT EXECUTED ON A GPU. The machines this was written on have no GPU and a CPU-only torch: here
`cuda_ipc` reports itself unavailable and CUDA tensors are refused with the reason. What ran here
is the pure logic (cuda_logic.py) and the transport's frames over a fake device (docs/transports.md).

Two paths, chosen per source like every transport:
- **Staging through pinned host memory (any transport: tcp, tcp-py, shm, rdma).** A
  `DeviceReplica` keeps a pinned host mirror of each CUDA tensor. Publishing copies device -> mirror
  once (the manifest's checksums are computed on the mirror); every host transport then serves the
  mirror. Fetching into CUDA tensors lands each unit in the mirror, verifies it there, and copies
  it host -> device before marking it present (so a relay never forwards unverified bytes).
- **`cuda_ipc` (same host, another process).** The server sends, per tensor and once per
  connection, the CUDA IPC handle of the allocation (`UntypedStorage._share_cuda_()`), then per
  unit only (tensor, offset, length). The reader opens the allocation and copies device -> device
  into its own CUDA tensor, then device -> its pinned mirror so the unit is verified like any
  other (a GPU-side hash would save that copy). Host-resident source tensors travel inline.

The mutability contract is the one of every transport: the source counts the read drained only
after the reader's "done" byte, so a release cannot free or overwrite memory a reader still maps.
"""
from __future__ import annotations

import logging
import os
import socket

import msgpack
import torch

from rlsync.hub.dataplane.wire import OK, UNIT
from rlsync.hub.errors import BufferMismatchError, ProtocolError, TransportUnavailableError
from rlsync.hub.model.manifest import Manifest, ManifestConfig, build_manifest, dtype_name
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.dataplane.transports import cuda_logic as C
from rlsync.hub.dataplane.transports.base import Transport, recv_exact, register_transport

log = logging.getLogger(__name__)


def unavailable_reason() -> str | None:
    """Why CUDA memory cannot be used here, or None."""
    avail = torch.cuda.is_available()
    return C.diagnose_cuda(torch.__version__, torch.version.cuda, avail, torch.cuda.device_count() if avail else 0)


def spec_of(name: str, t: torch.Tensor) -> C.BufferSpec:
    return C.BufferSpec(name, dtype_name(t.dtype), tuple(t.shape), str(t.device), t.is_contiguous())


def check_tensors(tensors: dict[str, torch.Tensor], what: str) -> None:
    """The client's tensor checks, with CUDA tensors allowed where CUDA is usable."""
    why = None
    for k, v in tensors.items():
        if v.device.type == "cuda":
            why = why or unavailable_reason() or ""
            if why:
                raise BufferMismatchError(f"{what}[{k!r}] is on {v.device}: {why}")
        elif v.device.type != "cpu":
            raise BufferMismatchError(f"{what}[{k!r}] is on {v.device}: host or CUDA tensors only")
        if not v.is_contiguous():
            raise BufferMismatchError(f"{what}[{k!r}] is not contiguous: pass .contiguous() tensors")
        dtype_name(v.dtype)


def check_into(manifest: Manifest, into: dict[str, torch.Tensor]) -> None:
    C.check_buffers(manifest.tensors, [spec_of(n, t) for n, t in into.items()], unavailable_reason() is None)


# The only device calls of the staging path, kept here so tests can stand in a fake device.
def _is_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def _pinned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)


def _sync() -> None:
    torch.cuda.synchronize()


class DeviceReplica(LocalReplica):
    """A replica whose tensors may live on GPUs, served and filled through pinned host mirrors.

    `tensors` (what transports read and write) are the host mirrors; `device_tensors` are the
    caller's tensors (CUDA or host). Host tensors are their own mirror: no copy for them.
    """

    def __init__(self, replica_id: str, manifest: Manifest, device_tensors: dict[str, torch.Tensor],
                 full: bool, host: dict[str, torch.Tensor] | None = None) -> None:
        self.device_tensors = dict(device_tensors)
        if host is None:
            host = {n: (_pinned_like(t) if _is_gpu(t) else t) for n, t in device_tensors.items()}
            if full:
                stage_to_host(self.device_tensors, host)
        self._cuda = [_is_gpu(self.device_tensors[s.name]) for s in manifest.tensors]
        super().__init__(replica_id, manifest, host, full)
        self.on_device = [full] * len(manifest.units)
        """Per unit: its bytes are already in the device tensors (cuda_ipc copied them there)."""

    @classmethod
    def for_publish(cls, replica_id: str, tensors: dict[str, torch.Tensor], cfg: ManifestConfig
                    ) -> "DeviceReplica":
        """Stage CUDA tensors into pinned mirrors (one device -> host copy) and checksum those."""
        host = {n: (_pinned_like(t) if _is_gpu(t) else t) for n, t in tensors.items()}
        stage_to_host(tensors, host)
        return cls(replica_id, build_manifest(host, cfg), tensors, full=True, host=host)

    def is_cuda(self, ti: int) -> bool:
        return self._cuda[ti]

    def mark_present(self, u: int) -> None:
        """A verified unit: copy it host -> device first, so what is present is on the GPU too."""
        if not self.on_device[u]:
            segs = C.device_copies(self.manifest.units[u].segments, self.is_cuda)
            for ti, off, ln in segs:
                name = self.manifest.tensors[ti].name
                _bytes_of(self.device_tensors[name])[off:off + ln].copy_(_bytes_of(self.tensors[name])[off:off + ln])
            if segs:
                _sync()
            self.on_device[u] = True
        super().mark_present(u)


def stage_to_host(device: dict[str, torch.Tensor], host: dict[str, torch.Tensor]) -> None:
    for n, t in device.items():
        if _is_gpu(t):
            host[n].copy_(t, non_blocking=True)
    if any(_is_gpu(t) for t in device.values()):
        _sync()


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def make_replica(replica_id: str, manifest: Manifest, tensors: dict[str, torch.Tensor], full: bool) -> LocalReplica:
    """A LocalReplica for host tensors, a DeviceReplica when any tensor is on a GPU."""
    if any(_is_gpu(t) for t in tensors.values()):
        return DeviceReplica(replica_id, manifest, tensors, full)
    return LocalReplica(replica_id, manifest, tensors, full)


# --------------------------------------------------------------------------- cuda_ipc
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
        why = unavailable_reason()
        if why:
            raise TransportUnavailableError(why.replace("cuda:", "cuda_ipc:", 1))

    def usable_between(self, mine: dict, peer: dict) -> bool:
        # IPC handles cannot be opened by the process that exported them.
        return (super().usable_between(mine, peer) and mine.get("boot_id") == peer.get("boot_id") != ""
                and mine.get("host") == peer.get("host") and mine.get("pid") != peer.get("pid"))

    def send_unit(self, conn: socket.socket, rep: LocalReplica, u: int) -> int:
        unit = rep.manifest.units[u]
        dev = getattr(rep, "device_tensors", {})
        names = [s.name for s in rep.manifest.tensors]

        def on_gpu(ti: int) -> bool:
            t = dev.get(names[ti])
            return t is not None and _is_gpu(t)

        parts = C.encode_frame(unit.segments, on_gpu, lambda ti: share_handle(dev[names[ti]]), self._book,
                               lambda ti, off, ln: rep.views[ti][off:off + ln])
        conn.sendall(UNIT.pack(u, OK, sum(len(p) for p in parts)))
        for p in parts:
            conn.sendall(p)
        return unit.nbytes

    def recv_unit(self, conn: socket.socket, dest: LocalReplica, u: int, nbytes: int, peer: dict) -> None:
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
            host = _bytes_of(dest.tensors[name])[s.offset:s.offset + s.length]
            target = dev.get(name)
            if target is not None and _is_gpu(target):
                _bytes_of(target)[s.offset:s.offset + s.length].copy_(src)  # device -> device
                host.copy_(_bytes_of(target)[s.offset:s.offset + s.length])  # -> mirror, to verify
            else:
                host.copy_(src)
                all_on_device = False
        _sync()
        if isinstance(dest, DeviceReplica) and all_on_device:
            dest.on_device[u] = True  # mark_present need not copy it up again
        return None

    def finish(self, conn: socket.socket) -> None:
        conn.sendall(b"\x01")

    def wait_finish(self, conn: socket.socket) -> None:
        recv_exact(conn, memoryview(bytearray(1)))

    def close(self) -> None:
        self._opened.clear()  # frees the opened storages: cudaIpcCloseMemHandle


def endpoint_info() -> dict:
    """What a worker advertises about its GPUs (for the planner's device labels)."""
    if unavailable_reason():
        return {}
    return {"cuda": {"devices": torch.cuda.device_count(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")}}
