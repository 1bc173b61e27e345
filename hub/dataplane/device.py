"""GPU memory as a replica: CUDA tensors as what a worker publishes and what a fetch lands in.

Every publish and fetch comes through here (the client's core path); no transport does. A
`DeviceReplica` keeps a pinned host mirror of each CUDA tensor. Publishing copies device -> mirror
once (the manifest's checksums are computed on the mirror); every host transport (tcp, tcp-py, shm,
rdma) then serves the mirror. Fetching into CUDA tensors lands each unit in the mirror, verifies it
there, and copies it host -> device before marking it present, so a relay never forwards unverified
bytes. The `cuda_ipc` transport (transports/cuda.py) reads and fills these replicas device to device.

NOT EXECUTED ON A GPU. The machines this was written on have no GPU and a CPU-only torch: here CUDA
tensors are refused with the reason. What ran here is the pure logic (`diagnose_cuda`,
`device_copies`; the buffer check is hub/model/manifest.py's) and the staging path over a fake device (docs/transports.md).
"""
from __future__ import annotations

import torch

from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.errors import BufferMismatchError
from rlsync.hub.model.manifest import Manifest, ManifestConfig, build_manifest, check_buffers, dtype_name, spec_of


# --------------------------------------------------------------------------- pure logic
def diagnose_cuda(torch_version: str, cuda_build: str | None, is_available: bool, device_count: int) -> str | None:
    """Why CUDA memory cannot be served or fetched here (None when it can)."""
    if not cuda_build:
        return (f"cuda: torch {torch_version} is a CPU-only build (torch.version.cuda is None); "
                "install a CUDA build of torch, and check the GPU with `nvidia-smi`")
    if not is_available or device_count == 0:
        return (f"cuda: no usable GPU (torch {torch_version}, CUDA {cuda_build}: torch.cuda.is_available() "
                "is False); check with `nvidia-smi` and the driver version")
    return None


def device_copies(segments, on_device) -> list[tuple[int, int, int]]:
    """The (ti, off, len) pieces of a unit that must be copied host -> device after it verified
    (staging of a fetch into CUDA tensors): the segments of tensors that live on a GPU."""
    return [(ti, off, ln) for ti, off, ln in segments if on_device(ti)]


# --------------------------------------------------------------------------- checks of the caller's tensors
def unavailable_reason() -> str | None:
    """Why CUDA memory cannot be used here, or None."""
    avail = torch.cuda.is_available()
    return diagnose_cuda(torch.__version__, torch.version.cuda, avail, torch.cuda.device_count() if avail else 0)


def check_tensors(tensors: dict[str, torch.Tensor], what: str) -> None:
    """The client's tensor checks: a dict of str -> contiguous host tensors, CUDA tensors allowed where
    CUDA is usable."""
    if not isinstance(tensors, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                for k, v in tensors.items()):
        raise BufferMismatchError(f"{what} must be a dict of str -> torch.Tensor")
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
    check_buffers(manifest.tensors, [spec_of(n, t) for n, t in into.items()], unavailable_reason() is None)


# --------------------------------------------------------------------------- the device calls
# The only device calls of the staging path (and of cuda_ipc's copies), kept here so tests can stand
# in a fake device; callers reach them through this module, so one replacement covers both.
def is_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def pinned_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)


def sync() -> None:
    torch.cuda.synchronize()


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


# --------------------------------------------------------------------------- replicas
class DeviceReplica(LocalReplica):
    """A replica whose tensors may live on GPUs, served and filled through pinned host mirrors.

    `tensors` (what transports read and write) are the host mirrors; `device_tensors` are the
    caller's tensors (CUDA or host). Host tensors are their own mirror: no copy for them.
    """

    def __init__(self, replica_id: str, manifest: Manifest, device_tensors: dict[str, torch.Tensor],
                 full: bool, host: dict[str, torch.Tensor] | None = None) -> None:
        self.device_tensors = dict(device_tensors)
        if host is None:
            host = {n: (pinned_like(t) if is_gpu(t) else t) for n, t in device_tensors.items()}
            if full:
                stage_to_host(self.device_tensors, host)
        self._cuda = [is_gpu(self.device_tensors[s.name]) for s in manifest.tensors]
        super().__init__(replica_id, manifest, host, full)
        self.on_device = [full] * len(manifest.units)
        """Per unit: its bytes are already in the device tensors (cuda_ipc copied them there)."""

    @classmethod
    def for_publish(cls, replica_id: str, tensors: dict[str, torch.Tensor], cfg: ManifestConfig
                    ) -> "DeviceReplica":
        """Stage CUDA tensors into pinned mirrors (one device -> host copy) and checksum those."""
        host = {n: (pinned_like(t) if is_gpu(t) else t) for n, t in tensors.items()}
        stage_to_host(tensors, host)
        return cls(replica_id, build_manifest(host, cfg), tensors, full=True, host=host)

    def is_cuda(self, ti: int) -> bool:
        return self._cuda[ti]

    def mark_present(self, u: int) -> None:
        """A verified unit: copy it host -> device first, so what is present is on the GPU too."""
        if not self.on_device[u]:
            segs = device_copies(self.manifest.units[u].segments, self.is_cuda)
            for ti, off, ln in segs:
                name = self.manifest.tensors[ti].name
                bytes_of(self.device_tensors[name])[off:off + ln].copy_(bytes_of(self.tensors[name])[off:off + ln])
            if segs:
                sync()
            self.on_device[u] = True
        super().mark_present(u)


def stage_to_host(device: dict[str, torch.Tensor], host: dict[str, torch.Tensor]) -> None:
    for n, t in device.items():
        if is_gpu(t):
            host[n].copy_(t, non_blocking=True)
    if any(is_gpu(t) for t in device.values()):
        sync()


def make_replica(replica_id: str, manifest: Manifest, tensors: dict[str, torch.Tensor], full: bool) -> LocalReplica:
    """A LocalReplica for host tensors, a DeviceReplica when any tensor is on a GPU."""
    if any(is_gpu(t) for t in tensors.values()):
        return DeviceReplica(replica_id, manifest, tensors, full)
    return LocalReplica(replica_id, manifest, tensors, full)
