"""The pure logic of GPU-memory replicas and the `cuda_ipc` transport: no CUDA call, testable anywhere.

- `diagnose_cuda`: why GPU memory cannot be used here, in one message with how to check.
- `check_buffers`: a fetch target's names, dtypes, shapes, contiguity and devices against a manifest
  — the checks every transport makes, extended to CUDA tensors (`BufferMismatchError`).
- The `cuda_ipc` unit frame: per segment either an IPC reference (tensor index, byte offset) into
  a CUDA allocation the reader opens once per connection, or "inline" (host bytes that follow in the
  frame, for segments whose source tensor lives in host memory). `IpcHandle` is what opening needs.

    payload = u32 header_len | msgpack header {"h": {ti: handle}, "s": [[0, ti, off, len] | [1, len]]}
              | the inline segments' bytes, in order
"""
from __future__ import annotations

import struct
from dataclasses import astuple, dataclass

import msgpack

from rlsync.hub.errors import BufferMismatchError, ProtocolError

IPC, INLINE = 0, 1
HEADER = struct.Struct("!I")
MAX_HEADER = 1 << 20


def diagnose_cuda(torch_version: str, cuda_build: str | None, is_available: bool, device_count: int) -> str | None:
    """Why CUDA memory cannot be served or fetched here (None when it can)."""
    if not cuda_build:
        return (f"cuda: torch {torch_version} is a CPU-only build (torch.version.cuda is None); "
                "install a CUDA build of torch, and check the GPU with `nvidia-smi`")
    if not is_available or device_count == 0:
        return (f"cuda: no usable GPU (torch {torch_version}, CUDA {cuda_build}: torch.cuda.is_available() "
                "is False); check with `nvidia-smi` and the driver version")
    return None


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """What the checks need of a tensor (built from a torch.Tensor by `spec_of`, or by hand in tests)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    device: str
    """'cpu', 'cuda:0' ..."""
    contiguous: bool


def check_buffers(manifest_tensors, into: list[BufferSpec], cuda_ok: bool) -> None:
    """Raise BufferMismatchError unless `into` matches the manifest's tensors (name, dtype, shape),
    each is contiguous and on the host or (when `cuda_ok`) a CUDA device — the same checks as
    Manifest.check_buffers, which accepts host memory only."""
    want = {s.name: s for s in manifest_tensors}
    have = {b.name: b for b in into}
    missing, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
    if missing or extra:
        raise BufferMismatchError(f"into tensors: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, s in want.items():
        b = have[name]
        if tuple(b.shape) != tuple(s.shape) or b.dtype != s.dtype:
            raise BufferMismatchError(f"into[{name!r}] is {tuple(b.shape)} {b.dtype}; the version has "
                                      f"{tuple(s.shape)} {s.dtype}")
        if not b.contiguous:
            raise BufferMismatchError(f"into[{name!r}] is not contiguous")
        kind = b.device.split(":")[0]
        if kind == "cuda" and not cuda_ok:
            raise BufferMismatchError(f"into[{name!r}] is on {b.device} but CUDA is unavailable here")
        if kind not in ("cpu", "cuda"):
            raise BufferMismatchError(f"into[{name!r}] is on {b.device}; host or CUDA memory expected")


@dataclass(frozen=True, slots=True)
class IpcHandle:
    """What `torch.UntypedStorage._share_cuda_()` returns, plus where the tensor starts in it."""

    device: int
    handle: bytes
    size_bytes: int
    offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes
    event_sync_required: bool
    tensor_offset: int
    """Bytes from the storage's start to the tensor's first element."""

    def to_wire(self) -> list:
        return list(astuple(self))

    @classmethod
    def from_wire(cls, w) -> "IpcHandle":
        try:
            d, h, size, off, rch, rco, ev, sync, toff = w
            h2 = cls(int(d), bytes(h), int(size), int(off), bytes(rch), int(rco), bytes(ev or b""), bool(sync), int(toff))
        except (TypeError, ValueError):
            raise ProtocolError("malformed CUDA IPC handle") from None
        if h2.device < 0 or h2.size_bytes < 0 or h2.tensor_offset < 0 or not h2.handle:
            raise ProtocolError("CUDA IPC handle out of range")
        return h2


class HandleBook:
    """Server side, per connection: send each tensor's IPC handle once, with its first unit."""

    def __init__(self) -> None:
        self.sent: set[int] = set()

    def take(self, tensor_indices) -> list[int]:
        new = [ti for ti in dict.fromkeys(tensor_indices) if ti not in self.sent]
        self.sent.update(new)
        return new


def encode_frame(segments, device_of, handle_of, book: HandleBook, inline_bytes) -> list:
    """Build a unit's frame pieces: [header bytes, *inline buffers].

    `segments` are the manifest's (ti, off, len); `device_of(ti)` says whether tensor ti is a CUDA
    tensor on the source; `handle_of(ti)` gives its IpcHandle; `inline_bytes(ti, off, len)` a buffer.
    """
    segs, inline = [], []
    for ti, off, ln in segments:
        if device_of(ti):
            segs.append([IPC, ti, off, ln])
        else:
            segs.append([INLINE, ln])
            inline.append(inline_bytes(ti, off, ln))
    new = book.take(ti for ti, _, _ in segments if device_of(ti))
    header = msgpack.packb({"h": {ti: handle_of(ti).to_wire() for ti in new}, "s": segs})
    return [HEADER.pack(len(header)) + header, *inline]


@dataclass(frozen=True, slots=True)
class Segment:
    kind: int
    """IPC or INLINE."""
    tensor: int
    """Index of the tensor in the manifest (the reader's own, from the manifest's segment)."""
    offset: int
    length: int


def decode_header(msg, manifest_segments, known_handles) -> tuple[list[Segment], dict[int, IpcHandle]]:
    """Validate a unit frame header against the reader's manifest segments [(ti, off, len)].

    `known_handles` are the tensor indices whose handles this connection already has; an IPC
    segment of a tensor with neither a known nor a new handle is a ProtocolError.
    """
    try:
        raw_h, raw_s = msg["h"], msg["s"]
        new = {int(ti): IpcHandle.from_wire(w) for ti, w in raw_h.items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ProtocolError("malformed cuda_ipc frame header") from None
    if not isinstance(raw_s, list) or len(raw_s) != len(manifest_segments):
        raise ProtocolError("cuda_ipc frame: segment count differs from the manifest")
    out = []
    for s, (ti, off, ln) in zip(raw_s, manifest_segments):
        if isinstance(s, list) and len(s) == 4 and s[0] == IPC:
            if (s[1], s[2], s[3]) != (ti, off, ln):
                raise ProtocolError(f"cuda_ipc frame: segment {s[1:]} differs from the manifest's {(ti, off, ln)}")
            if ti not in new and ti not in known_handles:
                raise ProtocolError(f"cuda_ipc frame: no IPC handle for tensor {ti}")
            out.append(Segment(IPC, ti, off, ln))
        elif isinstance(s, list) and len(s) == 2 and s[0] == INLINE:
            if s[1] != ln:
                raise ProtocolError(f"cuda_ipc frame: inline segment of {s[1]} bytes, manifest says {ln}")
            out.append(Segment(INLINE, ti, off, ln))
        else:
            raise ProtocolError("cuda_ipc frame: malformed segment")
    return out, new


def inline_total(segs: list[Segment]) -> int:
    return sum(s.length for s in segs if s.kind == INLINE)


def device_copies(segments, on_device) -> list[tuple[int, int, int]]:
    """The (ti, off, len) pieces of a unit that must be copied host -> device after it verified
    (staging of a fetch into CUDA tensors): the segments of tensors that live on a GPU."""
    return [(ti, off, ln) for ti, off, ln in segments if on_device(ti)]
