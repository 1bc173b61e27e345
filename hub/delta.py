"""Deltas between consecutive versions of a shard: per transfer unit, XOR of the raw bytes, bytes
regrouped by significance (byte-shuffle), compressed with zstd. Lossless; no I/O. docs/deltas.md says
why this encoding (measured on SmolLM2-135M updates) and who computes it.

A unit's delta is a self-describing frame:

    header  magic "RLD1", codec, shuffle width k, raw size, xxh3 of the base unit, xxh3 of the target unit
    payload codec(shuffle_k(base XOR target))

`decode_unit` checks the base bytes against the frame's base checksum (a delta made against other
bytes never applies), bounds the decompressed size, XORs into a separate output buffer and checks
the result against the *target manifest's* unit checksum: the bytes out are v's bytes, or the call
raises `DeltaError` and the base is untouched (it is only read).

    >>> import numpy as np
    >>> a, b = bytes(64), bytes(range(64))
    >>> d = encode_unit(a, b, base_checksum=checksum(a), target_checksum=checksum(b))
    >>> out = bytearray(64); decode_unit(a, d, out, expect_checksum=checksum(b)); bytes(out) == b
    True
"""
from __future__ import annotations

import struct
from typing import Sequence

import numpy as np
import xxhash

from .errors import DeltaError
from .manifest import ITEMSIZE, Manifest, Unit

MAGIC = b"RLD1"
HEADER = struct.Struct("<4sBBxxQQQ")  # magic, codec, shuffle k, raw nbytes, base xxh3, target xxh3
CODECS = {"xor-zstd": 1, "xor-raw": 2}
"""xor-zstd: the default. xor-raw: uncompressed XOR (tests, and a floor for the measurement)."""
_NAMES = {v: k for k, v in CODECS.items()}
ZSTD_LEVEL = 1
"""Measured (docs/deltas.md): level 1 is within a few % of level 3's size at about twice the speed."""


def checksum(buf) -> int:
    return xxhash.xxh3_64_intdigest(buf)


def _u8(buf) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8)


def _xor(a, b, out: np.ndarray | None = None) -> np.ndarray:
    a, b = _u8(a), _u8(b)
    if len(a) % 8 == 0 and (out is None or len(out) % 8 == 0):  # 8 bytes per op where it tiles
        o = np.bitwise_xor(a.view(np.uint64), b.view(np.uint64),
                           out=None if out is None else out.view(np.uint64))
        return o.view(np.uint8)
    return np.bitwise_xor(a, b, out=out)


def _shuffle(x: np.ndarray, k: int) -> np.ndarray:
    """Group byte j of every k-byte element together (the high bytes of bf16 rarely change)."""
    if k <= 1:
        return x
    m, out = len(x) // k, np.empty(len(x), np.uint8)
    xv = x.reshape(m, k)
    for j in range(k):  # k strided copies: ~10x faster than a copy of the transposed view (numpy)
        out[j * m:(j + 1) * m] = xv[:, j]
    return out


def _unshuffle(x: np.ndarray, k: int) -> np.ndarray:
    if k <= 1:
        return x
    m, out = len(x) // k, np.empty(len(x), np.uint8)
    ov = out.reshape(m, k)
    for j in range(k):
        ov[:, j] = x[j * m:(j + 1) * m]
    return out


def _zstd():
    import zstandard
    return zstandard


def encode_unit(base, target, *, base_checksum: int, target_checksum: int, itemsize: int = 1,
                codec: str = "xor-zstd") -> bytes:
    """The delta frame turning `base` into `target` (equal-length byte buffers)."""
    if len(memoryview(base)) != len(memoryview(target)):
        raise DeltaError("a unit's base and target differ in size: not the same layout")
    if codec not in CODECS:
        raise DeltaError(f"unknown delta codec {codec!r} (known: {sorted(CODECS)})")
    n = len(memoryview(target))
    k = itemsize if itemsize > 1 and n % itemsize == 0 else 1
    x = _shuffle(_xor(base, target), k)
    payload = _zstd().ZstdCompressor(level=ZSTD_LEVEL).compress(x.data) if codec == "xor-zstd" else x.tobytes()
    return HEADER.pack(MAGIC, CODECS[codec], k, n, base_checksum, target_checksum) + payload


def frame_info(delta) -> tuple[str, int, int, int, int]:
    """(codec, shuffle k, raw nbytes, base checksum, target checksum) of a frame; DeltaError if malformed."""
    mv = memoryview(delta)
    if len(mv) < HEADER.size:
        raise DeltaError("delta frame shorter than its header")
    magic, codec, k, n, bsum, tsum = HEADER.unpack(mv[:HEADER.size])
    if magic != MAGIC or codec not in _NAMES or k not in (1, 2, 4, 8) or (n % k):
        raise DeltaError("not an rlsync delta frame (bad magic, codec or shuffle width)")
    return _NAMES[codec], k, n, bsum, tsum


def decode_unit(base, delta, out, *, expect_checksum: int) -> None:
    """Write target = base XOR delta into `out` (a writable buffer of base's size, not base itself).

    Raises DeltaError (malformed, made against other base bytes, wrong size, or a result that is not
    the target): then `out` holds garbage and must not be used; `base` is never written.
    """
    codec, k, n, bsum, tsum = frame_info(delta)
    if len(memoryview(base)) != n or len(memoryview(out)) != n:
        raise DeltaError(f"delta is for a {n}-byte unit; the buffers hold {len(memoryview(base))}")
    if tsum != expect_checksum:
        raise DeltaError("delta targets other bytes than the version asked for (target checksum differs)")
    if checksum(base) != bsum:
        raise DeltaError("delta was made against other bytes than the reader holds (base checksum differs)")
    payload = memoryview(delta)[HEADER.size:]
    if codec == "xor-zstd":
        try:
            raw = _zstd().ZstdDecompressor().decompress(payload, max_output_size=n)
        except Exception as e:  # zstandard.ZstdError: corrupt frame
            raise DeltaError(f"corrupt delta payload: {e}") from None
    else:
        raw = payload
    if len(raw) != n:
        raise DeltaError(f"delta payload decodes to {len(raw)} bytes, expected {n}")
    _xor(base, _unshuffle(_u8(raw), k), out=_u8(out))
    if checksum(out) != expect_checksum:
        raise DeltaError("delta applied to the base does not give the target's checksum: discarded")


def unit_bytes(views: Sequence[memoryview], unit: Unit):
    """A unit's bytes: a zero-copy view when it is one segment, else its segments joined (packed units)."""
    if len(unit.segments) == 1:
        ti, off, ln = unit.segments[0]
        return views[ti][off:off + ln]
    return b"".join(views[ti][off:off + ln] for ti, off, ln in unit.segments)


def scatter(views: Sequence[memoryview], unit: Unit, data) -> None:
    """Write a unit's bytes back into its segments."""
    mv, pos = memoryview(data), 0
    for ti, off, ln in unit.segments:
        views[ti][off:off + ln] = mv[pos:pos + ln]
        pos += ln


def unit_itemsize(manifest: Manifest, unit: Unit) -> int:
    return ITEMSIZE[manifest.tensors[unit.segments[0][0]].dtype]


def encode(base_manifest: Manifest, base_views: Sequence[memoryview], manifest: Manifest,
           views: Sequence[memoryview], codec: str = "xor-zstd") -> list[bytes]:
    """Per unit of `manifest`, the frame from the base version's bytes to this version's."""
    if base_manifest.layout_key() != manifest.layout_key():
        raise DeltaError("base and target versions differ in layout (tensors or units): no delta")
    return [encode_unit(unit_bytes(base_views, bu), unit_bytes(views, u), base_checksum=bu.checksum,
                        target_checksum=u.checksum, itemsize=unit_itemsize(manifest, u), codec=codec)
            for bu, u in zip(base_manifest.units, manifest.units)]


def decode(manifest: Manifest, base_views: Sequence[memoryview], frames: Sequence, out_views: Sequence[memoryview],
           expect: Sequence[int] | None = None) -> None:
    """Apply one version's frames: `out_views` (other memory than `base_views`) get the target's bytes,
    every unit checked against `expect` (default: `manifest`'s unit checksums; an intermediate version
    of a chain passes its frames' own target checksums). `manifest` gives the layout.
    Raises DeltaError on any unit."""
    if len(frames) != len(manifest.units):
        raise DeltaError(f"delta has {len(frames)} units; the version has {len(manifest.units)}")
    expect = [u.checksum for u in manifest.units] if expect is None else expect
    for unit, frame, want in zip(manifest.units, frames, expect):
        if len(unit.segments) == 1:
            ti, off, ln = unit.segments[0]
            decode_unit(base_views[ti][off:off + ln], frame, out_views[ti][off:off + ln], expect_checksum=want)
        else:
            out = bytearray(unit.nbytes)
            decode_unit(unit_bytes(base_views, unit), frame, out, expect_checksum=want)
            scatter(out_views, unit, out)
