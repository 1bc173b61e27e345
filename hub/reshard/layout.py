"""Resharding: which byte ranges of which source shards fill a reader's tensors (pure logic, no I/O).

A sharded trainer publishes each rank's own partition as a shard of the version, no gather. Under
ZeRO-3 (DeepSpeed) every parameter is flattened and cut into `world` equal partitions of
ceil(numel / world) elements; rank r holds elements [r * ps, (r + 1) * ps), the last one padded past
numel. A rank publishes only the real elements of each partition (a view of its live partition: no
copy, no padding on the wire); `ShardedLayout` records, per rank and parameter, the full shape,
the flat start, the length published and the padding left out. Each shard carries its own record
(`record` / `parse_record`: a small JSON tensor, `LAYOUT_TENSOR`), checksummed like every unit.
A layout is checked when built (`LayoutError`): the ranks agree on every tensor and the pieces of
each tile it exactly, so no element is read from nowhere or from two ranks (docs/resharding.md).

A reader asks in its own layout: whole tensors, a row or column block of a named tensor (tensor
parallelism), or a fused destination that concatenates several such pieces along dim 0
(vLLM's qkv = concat(q, k, v)). `plan` maps every destination element range to (source rank,
tensor, offset) runs, so a reader pulls only the shards that hold its ranges and copies the runs.

    >>> lay = zero3_layout({"w": ((4, 3), "float32")}, world=2)   # 12 elements: 6 per rank
    >>> [(p.start, p.length, p.padding) for r in lay.ranks for p in r]
    [(0, 6, 0), (6, 6, 0)]
    >>> [(c.rank, c.src_off, c.dst_off, c.n) for c in plan(lay, [Dest.of(Slice("w", 1, 0, 3))]).copies]
    [(0, 0, 0, 1), (1, 0, 2, 1)]
    >>> [r for c in plan(lay, [Dest.of(Slice("w", 1, 0, 3))]).copies for r in c.runs()]   # column 0
    [(0, 0, 1), (3, 1, 1), (0, 2, 1), (3, 3, 1)]
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
import math
from dataclasses import dataclass, field

from rlsync.hub.errors import LayoutError, ManifestMismatchError
from rlsync.hub.model.manifest import ITEMSIZE
from rlsync.hub.model.names import LAYOUT_DIGEST, LAYOUT_TENSOR

"""Name of the uint8 tensor in each shard that holds its layout record (JSON)."""
"""Prefix of an empty uint8 tensor each shard carries, named by a digest of the whole layout: the hub
refuses a shard whose tensor names differ from another shard's of its version, so all ranks of a
version publish one layout (which tiles: checked when it was built), whichever publishes first."""


@dataclass(frozen=True, slots=True)
class FlatPiece:
    name: str
    dtype: str
    shape: tuple[int, ...]
    """The full (unsharded) parameter's shape."""
    start: int
    """First element of the flattened parameter this piece holds."""
    length: int
    """Elements published (the partition without its padding)."""
    padding: int
    """Elements of the partition past the parameter's end (held by the rank, never published)."""


@dataclass(frozen=True, slots=True)
class ShardedLayout:
    kind: str
    world: int
    ranks: tuple[tuple[FlatPiece, ...], ...]
    """Per rank, the pieces it publishes, in publish order."""

    def __post_init__(self) -> None:
        _validate(self)  # a layout that exists tiles: no gap, overlap or piece past a tensor's end

    def specs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {p.name: (p.shape, p.dtype) for r in self.ranks for p in r}


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_piece(r: int, p) -> None:
    """One piece on its own: well-typed, non-negative, inside its tensor."""
    if not isinstance(p, FlatPiece):
        raise LayoutError(f"rank {r}: pieces must be FlatPiece, got {type(p).__name__}")
    if not isinstance(p.name, str) or not p.name or p.name.startswith("__rlsync_layout"):
        raise LayoutError(f"rank {r}: tensor name {p.name!r} must be a non-empty str not starting with '__rlsync_layout'")
    if p.dtype not in ITEMSIZE:
        raise LayoutError(f"{p.name}: unknown dtype {p.dtype!r} (one of {sorted(ITEMSIZE)})")
    if not isinstance(p.shape, tuple) or not all(_is_int(x) and x >= 0 for x in p.shape):
        raise LayoutError(f"{p.name}: shape must be a tuple of ints >= 0, got {p.shape!r}")
    if not all(_is_int(x) and x >= 0 for x in (p.start, p.length, p.padding)):
        raise LayoutError(f"{p.name}: rank {r}'s start, length, padding must be ints >= 0, "
                          f"got {(p.start, p.length, p.padding)!r}")
    numel = math.prod(p.shape)
    if p.length and p.start + p.length > numel:
        raise LayoutError(f"{p.name}: rank {r}'s piece [{p.start}, {p.start + p.length}) runs past the "
                          f"tensor's end ({numel} elements of {p.shape})")


def _span(shape: tuple[int, ...], a: int, b: int) -> str:
    """Elements [a, b) of a tensor of `shape`, with the rows they are when they are whole rows."""
    row = math.prod(shape[1:]) if len(shape) > 1 else 0
    rows = f" (rows [{a // row}, {b // row}) of {shape})" if row and a % row == 0 and b % row == 0 else ""
    return f"elements [{a}, {b}){rows}"


def _validate(lay: "ShardedLayout") -> None:
    """LayoutError unless the ranks agree on every tensor (name order, dtype, shape) and the pieces of
    each tensor tile its flat elements exactly: every element in exactly one rank's piece."""
    if not isinstance(lay.kind, str) or not lay.kind:
        raise LayoutError(f"layout kind must be a non-empty str, got {lay.kind!r}")
    if not _is_int(lay.world) or lay.world < 1:
        raise LayoutError(f"world must be an int >= 1, got {lay.world!r}")
    if not isinstance(lay.ranks, tuple) or len(lay.ranks) != lay.world:
        raise LayoutError(f"a layout over world {lay.world} needs a tuple of {lay.world} ranks' pieces, "
                          f"got {len(lay.ranks) if isinstance(lay.ranks, tuple) else type(lay.ranks).__name__}")
    decl: dict[str, tuple[tuple[int, ...], str]] = {}
    spans: dict[str, list[tuple[int, int, int]]] = {}
    first: list[str] | None = None
    for r, pieces in enumerate(lay.ranks):
        if not isinstance(pieces, tuple):
            raise LayoutError(f"rank {r}'s pieces must be a tuple, got {type(pieces).__name__}")
        for p in pieces:
            _check_piece(r, p)
        names = [p.name for p in pieces]
        if len(set(names)) != len(names):
            raise LayoutError(f"rank {r} lists {sorted({n for n in names if names.count(n) > 1})[:3]} more "
                              "than once: a rank publishes one piece per tensor")
        if first is None:
            first = names
        elif names != first:  # the hub requires the shards of a version to agree on their tensors
            raise LayoutError(f"rank {r} lists tensors {names[:4]}..., rank 0 {first[:4]}...: every rank "
                              "lists the same tensors in the same order (length 0 where it holds none)")
        for p in pieces:
            if decl.setdefault(p.name, (p.shape, p.dtype)) != (p.shape, p.dtype):
                raise LayoutError(f"{p.name}: rank {r} declares {p.shape} {p.dtype}, an earlier rank "
                                  f"{decl[p.name][0]} {decl[p.name][1]}: every rank declares one shape and dtype")
            if p.length:
                spans.setdefault(p.name, []).append((p.start, p.start + p.length, r))
    for name, (shape, _) in decl.items():
        end, last = 0, None
        for a, b, r in sorted(spans.get(name, ())):
            if a > end:
                raise LayoutError(f"{name}: {_span(shape, end, a)} are in no rank's piece (a gap before rank "
                                  f"{r}'s [{a}, {b})): the pieces must tile all {math.prod(shape)} elements")
            if a < end:
                raise LayoutError(f"{name}: rank {r}'s piece [{a}, {b}) overlaps rank {last}'s in "
                                  f"{_span(shape, a, min(b, end))}: every element belongs to exactly one rank")
            end, last = b, r
        if end != math.prod(shape):
            raise LayoutError(f"{name}: {_span(shape, end, math.prod(shape))} are in no rank's piece (a gap at "
                              "the end): the pieces must tile the whole tensor")


def layout_digest(layout: ShardedLayout) -> str:
    """A digest of the whole layout (every rank's pieces): equal layouts, equal digests. Checks the
    layout again, so a publish and a read each validate what they are given."""
    if not isinstance(layout, ShardedLayout):
        raise LayoutError(f"a ShardedLayout is needed, got {type(layout).__name__}")
    return _digest(layout)


@lru_cache(maxsize=16)
def _digest(layout: ShardedLayout) -> str:
    _validate(layout)
    wire = [layout.kind, layout.world, [[[p.name, p.dtype, list(p.shape), p.start, p.length, p.padding]
                                        for p in r] for r in layout.ranks]]
    return hashlib.sha256(json.dumps(wire, separators=(",", ":")).encode()).hexdigest()[:32]


def digest_tensor_name(layout: ShardedLayout) -> str:
    """The name of the empty tensor that carries the layout's digest in every shard's manifest."""
    return LAYOUT_DIGEST + layout_digest(layout)


def zero3_layout(specs: dict[str, tuple[tuple[int, ...], str]], world: int) -> ShardedLayout:
    """DeepSpeed ZeRO-3's partitioning of `specs` (name -> (full shape, dtype)) over `world` ranks
    (deepspeed/runtime/zero/partition_parameters.py: _partition_param, _padding_size)."""
    if not _is_int(world) or world < 1:
        raise LayoutError(f"world must be an int >= 1, got {world!r}")
    ranks: list[list[FlatPiece]] = [[] for _ in range(world)]
    for name, (shape, dtype) in specs.items():
        numel = math.prod(shape)
        ps = -(-numel // world)
        for r in range(world):
            start = r * ps
            length = max(0, min(ps, numel - start))
            ranks[r].append(FlatPiece(name, dtype, tuple(shape), start, length, ps - length))
    return ShardedLayout("zero3", world, tuple(tuple(r) for r in ranks))


@lru_cache(maxsize=16)
def record(layout: ShardedLayout, rank: int) -> bytes:
    """Shard `rank`'s layout record: what its tensors are pieces of."""
    return json.dumps({"kind": layout.kind, "world": layout.world, "rank": rank,
                       "pieces": [[p.name, p.dtype, list(p.shape), p.start, p.length, p.padding]
                                  for p in layout.ranks[rank]]}, separators=(",", ":")).encode()


def parse_record(data: bytes) -> tuple[str, int, int, tuple[FlatPiece, ...]]:
    """(kind, world, rank, pieces) from a layout record; ManifestMismatchError if malformed."""
    try:
        d = json.loads(bytes(data).decode())
        pieces = tuple(FlatPiece(str(n), str(dt), tuple(int(x) for x in shp), int(s), int(ln), int(pad))
                       for n, dt, shp, s, ln, pad in d["pieces"])
        return str(d["kind"]), int(d["world"]), int(d["rank"]), pieces
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ManifestMismatchError(f"malformed layout record: {e}") from None


@dataclass(frozen=True, slots=True)
class Slice:
    """A block of a named tensor: `dim` None is the whole tensor; else block `part` of `parts`
    equal blocks along `dim` (0: rows, 1: columns)."""

    name: str
    dim: int | None = None
    part: int = 0
    parts: int = 1


@dataclass(frozen=True, slots=True)
class Dest:
    """A reader's tensor: its slices concatenated along dim 0 (one slice: just that block)."""

    name: str
    slices: tuple[Slice, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, s: Slice, name: str | None = None) -> "Dest":
        return cls(name or s.name, (s,))


@dataclass(frozen=True, slots=True)
class Copy:
    """`count` runs of `n` elements from rank `rank`'s piece of `src` (flat) at `src_off`, each next
    run `src_stride` further, to `dst` (flat) at `dst_off`, each next `dst_stride` further: a column
    block is one strided copy per source piece, not one per row."""

    rank: int
    src: str
    src_off: int
    dst: str
    dst_off: int
    n: int
    count: int = 1
    src_stride: int = 0
    dst_stride: int = 0

    def runs(self):
        """(src_off, dst_off, n) of each contiguous run."""
        return [(self.src_off + i * self.src_stride, self.dst_off + i * self.dst_stride, self.n)
                for i in range(self.count)]


def _merge(copies: list[Copy]) -> list[Copy]:
    """Fold consecutive single runs of one (rank, src, dst) with equal length and constant strides."""
    out: list[Copy] = []
    for c in copies:
        if out:
            last = out[-1]
            same = (last.rank, last.src, last.dst, last.n) == (c.rank, c.src, c.dst, c.n)
            if same and last.count == 1 and c.src_off > last.src_off and c.dst_off > last.dst_off:
                out[-1] = Copy(c.rank, c.src, last.src_off, c.dst, last.dst_off, c.n, 2,
                               c.src_off - last.src_off, c.dst_off - last.dst_off)
                continue
            if same and (c.src_off - last.src_off, c.dst_off - last.dst_off) == \
                    (last.count * last.src_stride, last.count * last.dst_stride):
                out[-1] = Copy(c.rank, c.src, last.src_off, c.dst, last.dst_off, c.n, last.count + 1,
                               last.src_stride, last.dst_stride)
                continue
        out.append(c)
    return out


@dataclass(slots=True)
class ReshardPlan:
    copies: list[Copy]
    shapes: dict[str, tuple[int, ...]]
    """Destination name -> shape."""
    dtypes: dict[str, str]

    def ranks(self) -> list[int]:
        return sorted({c.rank for c in self.copies})


def _slice_runs(shape: tuple[int, ...], s: Slice) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """(block shape, flat [start, end) runs of the full tensor in row-major block order)."""
    numel = math.prod(shape)
    if not (s.dim is None or _is_int(s.dim)) or not _is_int(s.part) or not _is_int(s.parts):
        raise LayoutError(f"{s.name}: dim must be None or an int, part and parts ints; got {s.dim!r}, {s.part!r}, {s.parts!r}")
    if s.dim is None:
        if (s.part, s.parts) != (0, 1):
            raise LayoutError(f"{s.name}: dim None is the whole tensor; block {s.part} of {s.parts} needs a dim")
        return shape, [(0, numel)] if numel else []
    if not 0 <= s.dim < len(shape):
        raise LayoutError(f"{s.name}: dim {s.dim} out of range for shape {shape}")
    mid = shape[s.dim]
    if s.parts < 1 or not 0 <= s.part < s.parts or mid % s.parts:
        raise LayoutError(f"{s.name}: cannot cut dim {s.dim} of size {mid} into {s.parts} equal blocks (block {s.part})")
    outer, inner, b = math.prod(shape[:s.dim]), math.prod(shape[s.dim + 1:]), mid // s.parts
    a = s.part * b
    runs = [(o * mid * inner + a * inner, o * mid * inner + (a + b) * inner) for o in range(outer)]
    return shape[:s.dim] + (b,) + shape[s.dim + 1:], [r for r in runs if r[1] > r[0]]


def plan(layout: ShardedLayout, dests: list[Dest]) -> ReshardPlan:
    """Map every element of `dests` to runs of the layout's source pieces (deterministic order:
    destination, slice, run, rank). Raises LayoutError for no destinations, two of one name, unknown
    tensors, bad blocks or a fused destination whose slices disagree in dtype or trailing shape."""
    if not isinstance(dests, (list, tuple)) or not dests:
        raise LayoutError(f"no destinations to read: pass a non-empty list of Dest, got {dests!r}"[:200])
    seen: set[str] = set()
    for d in dests:
        if not isinstance(d, Dest) or not isinstance(d.name, str) or not isinstance(d.slices, tuple):
            raise LayoutError(f"destinations must be Dest(name: str, slices: tuple of Slice), got {d!r}"[:200])
        if d.name in seen:  # else one silently overwrites the other in the result
            raise LayoutError(f"two destinations are named {d.name!r}: give each its own name")
        seen.add(d.name)
    specs = layout.specs()
    by_name: dict[str, list[tuple[int, FlatPiece]]] = {}
    for r, pieces in enumerate(layout.ranks):
        for p in pieces:
            if p.length:
                by_name.setdefault(p.name, []).append((r, p))
    copies: list[Copy] = []
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    for d in dests:
        if not d.slices:
            raise LayoutError(f"destination {d.name!r} has no slices")
        base, rows, tail, dtype, block = 0, 0, None, None, ()
        for s in d.slices:
            if not isinstance(s, Slice) or not isinstance(s.name, str):
                raise LayoutError(f"{d.name}: slices must be Slice(name: str, ...), got {s!r}"[:200])
            if s.name not in specs:
                raise LayoutError(f"{d.name}: no tensor {s.name!r} in the published layout")
            shape, dt = specs[s.name]
            block, runs = _slice_runs(shape, s)
            if tail is not None and (block[1:] != tail or dt != dtype):
                raise LayoutError(f"{d.name}: cannot concatenate {s.name} {block} {dt} after {tail} {dtype}")
            if len(d.slices) > 1 and not block:
                raise LayoutError(f"{d.name}: a 0-d tensor {s.name} cannot be concatenated")
            tail, dtype = block[1:], dt
            for lo, hi in runs:
                for r, p in by_name.get(s.name, ()):
                    a, b = max(lo, p.start), min(hi, p.start + p.length)
                    if a < b:
                        copies.append(Copy(r, s.name, a - p.start, d.name, base + (a - lo), b - a))
                base += hi - lo
            rows += block[0] if block else 1
        shapes[d.name] = block if len(d.slices) == 1 else (rows, *tail)
        dtypes[d.name] = dtype
    return ReshardPlan(_merge(copies), shapes, dtypes)
