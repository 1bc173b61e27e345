"""The pure logic of the `cuda_ipc` transport: no CUDA call, testable anywhere. (That of GPU memory
as a replica, the checks of CUDA tensors included, is in rlsync.hub.dataplane.device.)

The `cuda_ipc` unit frame: per segment either an IPC reference (tensor index, byte offset) into a
CUDA allocation the reader opens once per connection, or "inline" (host bytes that follow in the
frame, for segments whose source tensor lives in host memory). `IpcHandle` is what opening needs.

    payload = u32 header_len | msgpack header {"h": {ti: handle}, "s": [[0, ti, off, len] | [1, len]]}
              | the inline segments' bytes, in order
"""
from __future__ import annotations

import struct
from dataclasses import astuple, dataclass

import msgpack

from rlsync.hub.errors import ProtocolError

IPC, INLINE = 0, 1
HEADER = struct.Struct("!I")
MAX_HEADER = 1 << 20


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

