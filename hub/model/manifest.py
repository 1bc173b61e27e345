"""Manifests: what a (model, version, shard) is made of, cut into checksummed transfer units.

A manifest lists the shard's tensors in order (name, dtype, shape, bytes) and its *transfer units*.
A large tensor is split into chunks of `chunk_bytes`; tensors smaller than `pack_below` are packed
together into one unit up to `pack_bytes` (tiny-tensor compaction: a model's many biases and norms
then cost one request, not hundreds). Every unit carries an xxh3-64 checksum of its bytes; readers
verify each unit before they use it or serve it on.

    >>> import torch
    >>> m = build_manifest({"w": torch.zeros(4, 4), "b": torch.zeros(4)}, ManifestConfig())
    >>> [t.name for t in m.tensors], len(m.units)
    (['w', 'b'], 1)

The hub never sees tensor bytes: only this metadata crosses the control plane.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable

import xxhash

from rlsync.hub.errors import BufferMismatchError, ManifestMismatchError

if TYPE_CHECKING:  # torch is imported where tensors are touched, so the hub server starts without it
    import torch

# dtype name -> bytes per element: all a manifest needs to be checked without torch.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
            "int32": 4, "int64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def dtype_name(dtype: "torch.dtype") -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in ITEMSIZE:
        raise BufferMismatchError(f"dtype {dtype} is not supported by the hub")
    return name


def dtype_from_name(name: str) -> "torch.dtype":
    import torch
    if name not in ITEMSIZE:
        raise ManifestMismatchError(f"unknown dtype {name!r} in manifest")
    return getattr(torch, name)


def byte_view(t: "torch.Tensor") -> memoryview:
    """A zero-copy writable view of a contiguous CPU tensor's bytes."""
    if t.device.type != "cpu":
        raise BufferMismatchError(f"tensor on {t.device}: this transport serves host memory only")
    if not t.is_contiguous():
        raise BufferMismatchError("tensor is not contiguous: call .contiguous() and publish/fetch that")
    if t.numel() == 0:
        return memoryview(bytearray(0))
    import torch
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


@dataclass(kw_only=True, slots=True)
class ManifestConfig:
    chunk_bytes: int = 8 << 20
    """Large tensors are cut into transfer units of this many bytes."""
    pack_below: int = 256 << 10
    """Tensors smaller than this are packed together (tiny-tensor compaction)."""
    pack_bytes: int = 4 << 20
    """A packed unit holds tiny tensors up to this many bytes."""

    def __post_init__(self) -> None:
        if self.chunk_bytes <= 0 or self.pack_bytes <= 0 or self.pack_below < 0:
            raise ValueError("ManifestConfig sizes must be positive")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True, slots=True)
class Unit:
    """A transfer unit: byte ranges (tensor index, offset, length) sent back to back."""

    segments: tuple[tuple[int, int, int], ...]
    nbytes: int
    checksum: int


@dataclass(frozen=True, slots=True)
class Manifest:
    tensors: tuple[TensorSpec, ...]
    units: tuple[Unit, ...]
    nbytes: int = field(default=0)

    def to_wire(self) -> dict:
        return {"t": [[s.name, s.dtype, list(s.shape), s.nbytes] for s in self.tensors],
                "u": [[u.nbytes, u.checksum, [list(g) for g in u.segments]] for u in self.units]}

    @classmethod
    def from_wire(cls, d: dict) -> "Manifest":
        try:
            tensors = tuple(TensorSpec(str(n), str(dt), tuple(int(x) for x in shp), int(nb))
                            for n, dt, shp, nb in d["t"])
            units = tuple(Unit(tuple((int(a), int(b), int(c)) for a, b, c in segs), int(nb), int(cs))
                          for nb, cs, segs in d["u"])
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestMismatchError(f"malformed manifest: {e}") from None
        m = cls(tensors, units, sum(s.nbytes for s in tensors))
        m.validate()
        return m

    def validate(self) -> None:
        """Structural checks: every byte of every tensor is covered by exactly one unit segment."""
        names = [s.name for s in self.tensors]
        if len(set(names)) != len(names):
            raise ManifestMismatchError("duplicate tensor names in manifest")
        covered = [0] * len(self.tensors)
        for i, s in enumerate(self.tensors):
            if s.dtype not in ITEMSIZE:
                raise ManifestMismatchError(f"unknown dtype {s.dtype!r} in manifest")
            n = 1
            for x in s.shape:
                if x < 0:
                    raise ManifestMismatchError(f"negative dimension in {s.name}")
                n *= x
            if n * ITEMSIZE[s.dtype] != s.nbytes:
                raise ManifestMismatchError(f"{s.name}: nbytes {s.nbytes} != shape x itemsize")
        for u in self.units:
            if sum(g[2] for g in u.segments) != u.nbytes:
                raise ManifestMismatchError("unit size differs from its segments")
            for ti, off, ln in u.segments:
                if not 0 <= ti < len(self.tensors) or off != covered[ti] or ln <= 0:
                    raise ManifestMismatchError("unit segments do not tile the tensors in order")
                covered[ti] += ln
        if any(c != s.nbytes for c, s in zip(covered, self.tensors)):
            raise ManifestMismatchError("units do not cover every tensor byte")

    def layout_key(self) -> tuple:
        """What every copy of the same shard must agree on, checksums aside."""
        return (self.tensors, tuple((u.segments, u.nbytes) for u in self.units))

    def check_buffers(self, into: "dict[str, torch.Tensor]") -> None:
        """Raise BufferMismatchError unless `into` has exactly this manifest's names, shapes, dtypes
        (contiguous host tensors): `check_buffers` over the tensors' specs."""
        check_buffers(self.tensors, [spec_of(n, t) for n, t in into.items()])

    def verify(self, tensors: "dict[str, torch.Tensor]", units: "Iterable[int] | None" = None) -> list[int]:
        """Indices of `units` (all by default) whose bytes in `tensors` differ from their checksum.

        What a consumer runs on the bytes it is about to use (xxh3: ~30 ms for 540 MB here).
        """
        idx = range(len(self.units)) if units is None else units
        views: dict[int, memoryview] = {}
        bad = []
        for u in idx:
            unit = self.units[u]
            for ti, _, _ in unit.segments:
                if ti not in views:
                    views[ti] = byte_view(tensors[self.tensors[ti].name])
            h = xxhash.xxh3_64()
            for ti, off, ln in unit.segments:
                h.update(views[ti][off:off + ln])
            if h.intdigest() != unit.checksum:
                bad.append(u)
        return bad


def wire_digest(packed: bytes) -> str:
    """How a plan names a manifest: blake2b-128 (hex) of its msgpack wire bytes (`pack(m.to_wire())`)."""
    return hashlib.blake2b(packed, digest_size=16).hexdigest()


def unit_checksum(views: list[memoryview], unit: Unit) -> int:
    h = xxhash.xxh3_64()
    for ti, off, ln in unit.segments:
        h.update(views[ti][off:off + ln])
    return h.intdigest()


def _native_hash():
    """rlsync._engine.xxh3_64 (GIL-free, the widest SIMD this CPU has), or None without the engine."""
    try:
        from rlsync._engine import xxh3_64
    except ImportError:
        return None
    return xxh3_64


@lru_cache(maxsize=64)
def _unit_plan(sizes: tuple[int, ...], chunk: int, pack_below: int, pack_bytes: int) -> tuple[tuple[tuple[int, int, int], ...], ...]:
    """How tensors of these byte sizes are cut into units (segments per unit); a pure function of the
    sizes and the config, so a trainer publishing the same model every step plans it once."""
    plans: list[tuple[tuple[int, int, int], ...]] = []
    pack: list[tuple[int, int, int]] = []
    pack_size = 0
    for i, n in enumerate(sizes):
        if n == 0:
            continue
        if n < pack_below:
            if pack and pack_size + n > pack_bytes:
                plans.append(tuple(pack))
                pack, pack_size = [], 0
            pack.append((i, 0, n))
            pack_size += n
            continue
        for off in range(0, n, chunk):
            plans.append(((i, off, min(chunk, n - off)),))
    if pack:
        plans.append(tuple(pack))
    return tuple(plans)


def build_manifest(tensors: "dict[str, torch.Tensor]", cfg: ManifestConfig) -> Manifest:
    """Describe live tensors (no copy) and checksum every unit of them.

    The hashing is the whole cost of a publish (one pass over its bytes): it runs in the native
    engine over the tensors' memory with the GIL released (`xxh3_64`, same digest as xxhash's), one
    call per unit; the unit plan is cached per (sizes, config)."""
    import torch
    specs, addrs = [], []
    native = _native_hash()
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, torch.Tensor):
            raise BufferMismatchError("tensors must be a dict of str -> torch.Tensor")
        if t.device.type != "cpu":
            raise BufferMismatchError(f"tensor on {t.device}: this transport serves host memory only")
        if not t.is_contiguous():
            raise BufferMismatchError("tensor is not contiguous: call .contiguous() and publish/fetch that")
        nbytes = t.numel() * t.element_size()
        specs.append(TensorSpec(name, dtype_name(t.dtype), tuple(t.shape), nbytes))
        addrs.append(t.data_ptr())
    plans = _unit_plan(tuple(s.nbytes for s in specs), cfg.chunk_bytes, cfg.pack_below, cfg.pack_bytes)
    units = []
    if native is not None:
        for segs in plans:
            digest = native([(addrs[ti] + off, ln) for ti, off, ln in segs])
            units.append(Unit(segs, sum(g[2] for g in segs), digest))
    else:
        views = [byte_view(t) for t in tensors.values()]
        for segs in plans:
            u = Unit(segs, sum(g[2] for g in segs), 0)
            units.append(Unit(segs, u.nbytes, unit_checksum(views, u)))
    return Manifest(tuple(specs), tuple(units), sum(s.nbytes for s in specs))


def allocate(manifest: Manifest) -> "dict[str, torch.Tensor]":
    """Fresh host buffers shaped like the manifest's tensors."""
    import torch
    return {s.name: torch.empty(s.shape, dtype=dtype_from_name(s.dtype)) for s in manifest.tensors}


@dataclass(frozen=True, slots=True)
class BufferSpec:
    """What the buffer check needs of a destination tensor (`spec_of` builds it from a torch.Tensor; a
    reader's wire `into_spec` gives name, dtype and shape only; tests build it by hand)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    device: str = "cpu"
    """'cpu', 'cuda:0' ..."""
    contiguous: bool = True


def spec_of(name: str, t) -> BufferSpec:
    return BufferSpec(name, dtype_name(t.dtype), tuple(t.shape), str(t.device), t.is_contiguous())


def check_buffers(manifest_tensors, into: "list[BufferSpec]", cuda_ok: bool | None = None) -> None:
    """THE buffer check (the client's host fetch, its CUDA fetch, and the hub's check of a reader's
    `into_spec`): raise BufferMismatchError unless `into` matches the manifest's tensors exactly (names,
    dtypes, shapes), each contiguous, in host memory — or, when `cuda_ok` is not None, in CUDA memory too
    (refused while CUDA is unusable here: `cuda_ok` False)."""
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
        if kind == "cuda" and cuda_ok is False:
            raise BufferMismatchError(f"into[{name!r}] is on {b.device} but CUDA is unavailable here")
        if kind != "cpu" and not (kind == "cuda" and cuda_ok):
            raise BufferMismatchError(f"into[{name!r}] is on {b.device}; "
                                      + ("host memory expected" if cuda_ok is None else "host or CUDA memory expected"))
