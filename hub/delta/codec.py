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

from rlsync.hub.errors import DeltaError
from rlsync.hub.model.manifest import ITEMSIZE, Manifest, Unit

MAGIC = b"RLD1"
HEADER = struct.Struct("<4sBBxxQQQ")  # magic, codec, shuffle k, raw nbytes, base xxh3, target xxh3
CODECS = {"xor-zstd": 1, "xor-raw": 2}
"""xor-zstd: the default. xor-raw: uncompressed XOR (tests, and a floor for the measurement)."""
_NAMES = {v: k for k, v in CODECS.items()}
try:  # the native one-pass unshuffle + XOR + hash (csrc/engine.cpp); numpy without it
    from rlsync._engine import unshuffle_xor as _native
except ImportError:
    _native = None
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
    decode_chain_unit(base, [delta], out, expect_checksum=expect_checksum)


def decode_chain_unit(base, deltas: Sequence, out, *, expect_checksum: int, scratch: np.ndarray | None = None) -> None:
    """`decode_unit` for a chain of frames (oldest first): out = base ^ d1 ^ d2 ..., applied in `out`
    one frame after the other, checked once at the end (each frame's base checksum must be the previous
    frame's target checksum: a header check). The same refusals; `base` is never written. `scratch`: a
    reusable uint8 buffer of at least the unit's size for the decompressed bytes (else one is allocated)."""
    infos = [frame_info(d) for d in deltas]
    n = len(memoryview(base))
    if not infos or any(i[2] != n for i in infos) or len(memoryview(out)) != n:
        raise DeltaError(f"delta is for a {infos[0][2] if infos else 0}-byte unit; the buffers hold {n}")
    if infos[-1][4] != expect_checksum:
        raise DeltaError("delta targets other bytes than the version asked for (target checksum differs)")
    if any(b[3] != a[4] for a, b in zip(infos, infos[1:])):
        raise DeltaError("a delta of the chain is not made against the previous one's target")
    if checksum(base) != infos[0][3]:
        raise DeltaError("delta was made against other bytes than the reader holds (base checksum differs)")
    src, got = base, None
    for i, (d, (codec, k, _, _, _)) in enumerate(zip(deltas, infos)):
        raw = _payload(memoryview(d)[HEADER.size:], codec, n, scratch)
        got = _apply(src, raw, out, k, want_checksum=i == len(deltas) - 1)
        src = out
    if got != expect_checksum:
        raise DeltaError("delta applied to the base does not give the target's checksum: discarded")


def _payload(payload: memoryview, codec: str, n: int, scratch: np.ndarray | None):
    """A frame's payload decompressed (into `scratch`: no fresh pages per unit); exactly n bytes."""
    if codec != "xor-zstd":
        if len(payload) != n:
            raise DeltaError(f"delta payload decodes to {len(payload)} bytes, expected {n}")
        return payload
    dst = memoryview(scratch if scratch is not None and len(scratch) >= n else np.empty(n, np.uint8))[:n]
    try:
        with _zstd().ZstdDecompressor().stream_reader(payload) as r:
            got = r.readinto(dst) if n else 0
            while got < n:  # readinto may stop short of a full buffer
                more = r.readinto(dst[got:])
                if not more:
                    break
                got += more
            extra = len(r.read(1))
    except DeltaError:
        raise
    except Exception as e:  # zstandard.ZstdError: corrupt frame
        raise DeltaError(f"corrupt delta payload: {e}") from None
    if got != n or extra:
        raise DeltaError(f"delta payload decodes to {'more than ' if extra else ''}{got} bytes, expected {n}")
    return dst


def _apply(base, raw, out, k: int, want_checksum: bool) -> int | None:
    """out = base XOR unshuffle_k(raw) (base may be out); xxh3-64 of out when `want_checksum`."""
    b, x, o = _u8(base), _u8(raw), _u8(out)
    if _native is not None and len(o):  # one pass, hashed while hot (csrc/engine.cpp)
        return _native(b.ctypes.data, x.ctypes.data, o.ctypes.data, len(o), k, want_checksum)
    _xor(b, _unshuffle(x, k), out=o)
    return checksum(o) if want_checksum else None


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
    every unit checked against `expect` (default: `manifest`'s unit checksums). `manifest` gives the
    layout. Raises DeltaError on any unit."""
    decode_chain(manifest, base_views, [frames], out_views, expect)


def decode_chain(manifest: Manifest, base_views: Sequence[memoryview], chain: Sequence[Sequence],
                 out_views: Sequence[memoryview], expect: Sequence[int] | None = None) -> None:
    """Apply a chain of versions' frames (oldest first) unit by unit (`decode_chain_unit`): no
    intermediate version is materialized or hashed; each unit's result is checked against `expect`."""
    if any(len(frames) != len(manifest.units) for frames in chain):
        raise DeltaError(f"delta has {[len(f) for f in chain]} units; the version has {len(manifest.units)}")
    expect = [u.checksum for u in manifest.units] if expect is None else expect
    scratch = np.empty(max((u.nbytes for u in manifest.units), default=0), np.uint8)
    for i, (unit, want) in enumerate(zip(manifest.units, expect)):
        frames = [fr[i] for fr in chain]
        if len(unit.segments) == 1:
            ti, off, ln = unit.segments[0]
            decode_chain_unit(base_views[ti][off:off + ln], frames, out_views[ti][off:off + ln], expect_checksum=want,
                              scratch=scratch)
        else:
            out = bytearray(unit.nbytes)
            decode_chain_unit(unit_bytes(base_views, unit), frames, out, expect_checksum=want, scratch=scratch)
            scatter(out_views, unit, out)
