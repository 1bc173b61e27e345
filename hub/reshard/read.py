"""Sharded publish and resharding reads over the hub (the I/O side of rlsync.hub.reshard.layout).

    layout = zero3_layout({name: (shape, dtype), ...}, world=2)
    publish_shard(hub, "policy", v, layout, rank, {name: live_partition, ...})   # on every rank
    ReshardReader(hub, "policy", layout).read_whole("latest")                    # whole tensors
    ReshardReader(hub, "policy", layout).read("latest", [Dest.of(Slice("w", 0, k, 2))])  # TP rank k

A ZeRO-3 rank's shard travels under the shard coordinate `zero_shard(rank, world)` (=
`Shard(tp=rank, tp_size=world)`), so the hub's transactional commit across shards applies
unchanged: the version becomes visible once every rank has published. The kind of split is in the
layout record each shard carries (`LAYOUT_TENSOR`); a reader checks it against the layout it
expects and refuses a mismatch (ManifestMismatchError). Each shard also carries an empty tensor
named by a digest of the whole layout (`LAYOUT_DIGEST`), so the hub refuses a rank that publishes
another layout than a rank before it (LayoutError), and a reader of another layout before any byte
moves (its buffers' names differ: BufferMismatchError). A layout is checked to tile when built and
again when published or read (docs/resharding.md, "Layouts are checked").

Whole-tensor reads land each source shard straight in the reader's tensors: the fetch's buffers are
views of the destination at the piece's flat range, so no byte is staged or copied after the
transfer, and the reader then serves those shards to other readers of any layout. Slice reads
(TP blocks, fused qkv) move only the transfer units that overlap their ranges (a partial fetch,
hub/client/partial.py: each unit verified against its own checksum), from the shards that hold
them, into one reusable scratch set (one shard's worth, not the model), and copy the planned runs
out of it (one strided copy per column block of a piece). A sharded publish cuts its shard into
small units (`SHARD_UNITS`, 1 MiB) so that a slice's ranges cost little more than themselves.
Simplifies: a unit is the smallest verifiable range, so a column block (half of every row) still
moves the whole of each unit it touches, i.e. the whole tensor; the runs are copied by torch, not
landed strided by the data plane; a slice reader is not a relay (it holds part of a shard).
"""
from __future__ import annotations

import time
from bisect import bisect_right
from dataclasses import dataclass, field

import torch

from rlsync.hub.errors import BufferMismatchError, LayoutError, ManifestMismatchError, ShardError
from rlsync.hub.model.manifest import ITEMSIZE, Manifest, ManifestConfig, dtype_from_name, dtype_name
from rlsync.hub.reshard.layout import Dest, ShardedLayout, digest_tensor_name, parse_record, plan, record
from rlsync.hub.model.names import LAYOUT_TENSOR
from rlsync.hub.model.shard import Shard


def zero_shard(rank: int, world: int) -> Shard:
    return Shard(tp=rank, tp_size=world)


def shard_tensors(layout: ShardedLayout, rank: int, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What `rank` publishes: a view of the published part of each live partition (no copy), its
    layout record and the layout's digest (an empty tensor named by it: the hub refuses a rank whose
    digest differs from another's of the version). `live[name]` is the rank's whole partition
    (length + padding elements). The layout is checked again here (it tiles; LayoutError if not)."""
    digest = digest_tensor_name(layout)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < layout.world:
        raise ShardError(f"rank {rank!r} is outside the layout's world of {layout.world}")
    if not isinstance(live, dict):
        raise BufferMismatchError(f"live must be a dict of name -> partition, got {type(live).__name__}")
    out: dict[str, torch.Tensor] = {}
    for p in layout.ranks[rank]:
        t = live.get(p.name)
        if t is None or t.numel() != p.length + p.padding or not t.is_contiguous() or dtype_name(t.dtype) != p.dtype:
            raise BufferMismatchError(f"rank {rank}: partition of {p.name!r} should be {p.length + p.padding} "
                                      f"contiguous {p.dtype} elements, got "
                                      f"{None if t is None else (t.numel(), t.dtype, t.is_contiguous())}")
        out[p.name] = t.view(-1).narrow(0, 0, p.length)
    out[LAYOUT_TENSOR] = torch.frombuffer(bytearray(record(layout, rank)), dtype=torch.uint8)
    out[digest] = torch.empty(0, dtype=torch.uint8)
    return out


SHARD_UNITS = ManifestConfig(chunk_bytes=1 << 20, pack_below=64 << 10, pack_bytes=1 << 20)
"""Transfer units of a sharded publish: 1 MiB (not the 8 MiB default), small tensors packed only up
to 1 MiB, so a slice reader's partial fetch moves little beyond its ranges."""


def publish_shard(hub, model: str, version: int, layout: ShardedLayout, rank: int,
                  live: dict[str, torch.Tensor], units: ManifestConfig = SHARD_UNITS, wait: bool = True):
    """Publish rank `rank`'s shard; with `wait=False` through `publish_async` (returns its future:
    the checksum pass runs while the caller goes on; `hub.release` waits for it)."""
    args = (model, version, shard_tensors(layout, rank, live))
    kw = dict(shard=zero_shard(rank, layout.world), manifest_config=units)
    return hub.publish(*args, **kw) if wait else hub.publish_async(*args, **kw)


@dataclass(slots=True)
class ReshardResult:
    version: int
    tensors: dict[str, torch.Tensor]
    bytes_by_source: dict[str, int]
    """Worker id -> bytes it served to this read (over every shard fetched)."""
    shards_fetched: list[int]
    seconds: float = 0.0
    """Sum of the shard fetches' wall times."""
    transports: dict[str, str] = field(default_factory=dict)
    """Worker id -> transport it served with (any shard)."""
    manifests: dict[int, object] = field(default_factory=dict)
    """Shard rank -> the manifest its fetch verified (a whole read's views: `whole_views`)."""

    @property
    def nbytes(self) -> int:
        return sum(self.bytes_by_source.values())


class ReshardReader:
    """One reader of a sharded model, in its own layout. Keeps the buffers it registered with the hub
    (it serves the shards it fetched until it reads the next version or leaves)."""

    def __init__(self, hub, model: str, layout: ShardedLayout) -> None:
        self._digest = digest_tensor_name(layout)  # checks the layout tiles before any byte moves
        self.hub, self.model, self.layout = hub, model, layout
        self._records = {r: torch.empty(len(record(layout, r)), dtype=torch.uint8) for r in range(layout.world)}
        self._scratch: dict[str, torch.Tensor] | None = None

    def _fetch(self, rank: int, version, into: dict[str, torch.Tensor], acc: dict[str, int],
               runs: dict[str, list[tuple[int, int]]] | None = None, out: ReshardResult | None = None) -> int:
        """Fetch shard `rank` into `into`: whole, or (with `runs`: tensor -> sorted element ranges)
        only the units overlapping those ranges and the layout record. `out` gathers seconds,
        transports and the manifest."""
        into = {**into, LAYOUT_TENSOR: self._records[rank], self._digest: torch.empty(0, dtype=torch.uint8)}
        shard = zero_shard(rank, self.layout.world)
        t0 = time.perf_counter()
        if runs is None:
            res = self.hub.fetch(self.model, version, into=into, shard=shard)
        else:
            res = self.hub.fetch_units(self.model, version, shard, into, lambda m: _units_for(m, runs))
        for w, n in res.bytes_by_source.items():
            acc[w] = acc.get(w, 0) + n
        if out is not None:
            out.seconds += time.perf_counter() - t0
            out.transports.update(getattr(res, "transports", {}))  # a partial fetch does not say
            out.manifests[rank] = res.manifest
        kind, world, r, pieces = parse_record(self._records[rank].numpy().tobytes())
        if (kind, world, r, pieces) != (self.layout.kind, self.layout.world, rank, self.layout.ranks[rank]):
            raise ManifestMismatchError(f"{self.model} v{res.version} shard {rank}: published as {kind} over "
                                        f"{world} ranks with other pieces than this reader's {self.layout.kind} layout")
        return res.version

    def views(self, rank: int, into: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Shard `rank` as a whole read of `into` holds it (what its manifest checks, record included)."""
        return whole_views(self.layout, rank, into, self._records[rank])

    def read_whole(self, version: int | str = "latest", into: dict[str, torch.Tensor] | None = None) -> ReshardResult:
        """Every full tensor, each shard landing in place in `into` (allocated if None)."""
        specs = self.layout.specs()
        if into is None:
            into = {n: torch.empty(shape, dtype=dtype_from_name(dt)) for n, (shape, dt) in specs.items()}
        _check(into, {n: s for n, (s, _) in specs.items()}, {n: dt for n, (_, dt) in specs.items()})
        out = ReshardResult(-1, into, {}, list(range(self.layout.world)))
        for r in range(self.layout.world):  # the first resolves "latest"; the others are pinned to it
            version = self._fetch(r, version, whole_views(self.layout, r, into), out.bytes_by_source, out=out)
        out.version = int(version)
        return out

    def read(self, version: int | str, dests: list[Dest], into: dict[str, torch.Tensor] | None = None) -> ReshardResult:
        """The destinations (TP blocks, fused concatenations), from only the shards holding them."""
        p = plan(self.layout, dests)
        if into is None:
            into = {n: torch.empty(s, dtype=dtype_from_name(p.dtypes[n])) for n, s in p.shapes.items()}
        _check(into, p.shapes, p.dtypes)
        if self._scratch is None:  # one shard's worth, reused: fetching the next shard releases the last
            longest: dict[str, int] = {}
            for pieces in self.layout.ranks:
                for q in pieces:
                    longest[q.name] = max(longest.get(q.name, 0), q.length)
            self._scratch = {n: torch.empty(k, dtype=dtype_from_name(self.layout.specs()[n][1]))
                             for n, k in longest.items()}
        ranks = p.ranks()
        if not ranks:
            raise LayoutError("nothing to read: every destination is empty (0 elements)")
        out = ReshardResult(-1, into, {}, ranks)
        for r in ranks:
            views = {q.name: self._scratch[q.name][:q.length] for q in self.layout.ranks[r]}
            version = self._fetch(r, version, views, out.bytes_by_source, _runs([c for c in p.copies if c.rank == r]), out)
            for c in p.copies:
                if c.rank == r:
                    _copy(c, views[c.src], into[c.dst].view(-1))
        out.version = int(version)
        return out


def whole_views(layout: ShardedLayout, rank: int, into: dict[str, torch.Tensor],
                record_buf: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Shard `rank`'s tensors as views of whole tensors `into` (each piece at its flat range): what a
    whole read fetches into, and what its manifest verifies (with the layout record, `record_buf`)."""
    views = {p.name: into[p.name].view(-1).narrow(0, p.start, p.length) if p.length
             else into[p.name].view(-1)[:0] for p in layout.ranks[rank]}
    if record_buf is not None:
        views[LAYOUT_TENSOR] = record_buf
        views[digest_tensor_name(layout)] = torch.empty(0, dtype=torch.uint8)
    return views


def _runs(copies) -> dict[str, list[tuple[int, int]]]:
    """Source tensor -> sorted, merged [start, end) element ranges the copies read."""
    out: dict[str, list[tuple[int, int]]] = {}
    for c in copies:
        out.setdefault(c.src, []).extend((c.src_off + i * c.src_stride, c.src_off + i * c.src_stride + c.n)
                                         for i in range(c.count))
    for name, rs in out.items():
        rs.sort()
        merged = [rs[0]]
        for a, b in rs[1:]:
            if a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        out[name] = merged
    return out


def _units_for(m: Manifest, runs: dict[str, list[tuple[int, int]]]) -> list[int]:
    """Units of `m` holding any byte of `runs` (elements), and every unit of the layout record."""
    spans = {}
    for s in m.tensors:
        rs = runs.get(s.name)
        if rs:
            k = ITEMSIZE[s.dtype]
            spans[s.name] = ([a * k for a, _ in rs], [b * k for _, b in rs])
    out = []
    for u, unit in enumerate(m.units):
        for ti, off, ln in unit.segments:
            name = m.tensors[ti].name
            if name == LAYOUT_TENSOR:
                out.append(u)
                break
            if name in spans:
                starts, ends = spans[name]
                i = bisect_right(starts, off + ln - 1) - 1  # the last range starting inside or before
                if i >= 0 and ends[i] > off:
                    out.append(u)
                    break
    return out


def _copy(c, src: torch.Tensor, dst: torch.Tensor) -> None:
    """One planned copy: `count` runs as a single strided copy (a column block of a piece)."""
    if c.count == 1:
        dst[c.dst_off:c.dst_off + c.n].copy_(src[c.src_off:c.src_off + c.n])
        return
    dst.as_strided((c.count, c.n), (c.dst_stride, 1), c.dst_off).copy_(
        src.as_strided((c.count, c.n), (c.src_stride, 1), c.src_off))


def _check(into: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]) -> None:
    if set(into) != set(shapes):
        raise BufferMismatchError(f"into has {sorted(into)[:5]}, the layout needs {sorted(shapes)[:5]}")
    for n, t in into.items():
        if tuple(t.shape) != tuple(shapes[n]) or dtype_name(t.dtype) != dtypes[n] or not t.is_contiguous():
            raise BufferMismatchError(f"into[{n!r}] is {tuple(t.shape)} {t.dtype}; needs contiguous "
                                      f"{tuple(shapes[n])} {dtypes[n]}")
