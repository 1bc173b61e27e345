"""Resharding (rlsync.hub.reshard.layout, reshard_read): ZeRO-3 flat shards published without a gather, read
back as whole tensors, TP row/column blocks and a fused qkv, bit-exact, with the bytes each source served.

The partitions here are cut the way DeepSpeed ZeRO-3 cuts them (flatten, ceil(numel / world) per rank,
the last padded); tests/trainer/test_zero3_sharded_publish.py publishes DeepSpeed's own live partitions.
"""
from __future__ import annotations

import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.reshard.layout import Dest, Slice, parse_record, plan, record, zero3_layout
from rlsync.hub.model.names import LAYOUT_TENSOR
from rlsync.hub.reshard.read import ReshardReader, publish_shard, shard_tensors


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(8, 6, generator=g), "k": torch.randn(4, 6, generator=g),
            "v": torch.randn(4, 6, generator=g), "o": torch.randn(6, 8, generator=g),
            "odd": torch.randn(7, generator=g).to(torch.bfloat16),   # 7 over 2 ranks: padded
            "one": torch.randn(1, generator=g, dtype=torch.float64)}  # rank 1 holds nothing of it


def specs(tensors):
    return {n: (tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()}


def partitions(tensors, world, rank):
    """ZeRO-3's partition of each tensor for `rank`, padding included (as p.ds_tensor)."""
    out = {}
    for n, t in tensors.items():
        flat, ps = t.reshape(-1), -(-t.numel() // world)
        part = torch.zeros(ps, dtype=t.dtype)
        piece = flat[rank * ps:(rank + 1) * ps]
        part[:piece.numel()] = piece
        out[n] = part
    return out


def test_zero3_layout_matches_deepspeeds_partitioning():
    lay = zero3_layout(specs(model()), 2)
    got = {(r, p.name): (p.start, p.length, p.padding) for r, ps in enumerate(lay.ranks) for p in ps}
    assert got[(0, "odd")] == (0, 4, 0) and got[(1, "odd")] == (4, 3, 1)
    assert got[(0, "one")] == (0, 1, 0) and got[(1, "one")] == (1, 0, 1)
    assert got[(0, "q")] == (0, 24, 0) and got[(1, "q")] == (24, 24, 0)
    assert parse_record(record(lay, 1))[3] == lay.ranks[1]
    with pytest.raises(E.ManifestMismatchError):
        parse_record(b"{not json")


def test_plan_covers_every_destination_element_once():
    t = model()
    lay = zero3_layout(specs(t), 2)
    dests = [Dest.of(Slice("q", 0, 1, 2)), Dest.of(Slice("o", 1, 0, 2)),
             Dest("qkv", (Slice("q", 0, 1, 2), Slice("k", 0, 1, 2), Slice("v", 0, 1, 2))),
             Dest.of(Slice("odd")), Dest.of(Slice("one"))]
    p = plan(lay, dests)
    assert p.shapes == {"q": (4, 6), "o": (6, 4), "qkv": (8, 6), "odd": (7,), "one": (1,)}
    for d, shape in p.shapes.items():
        cover = sorted((o, o + n) for c in p.copies if c.dst == d for _, o, n in c.runs())
        assert cover[0][0] == 0 and cover[-1][1] == torch.Size(shape).numel()
        assert all(a[1] == b[0] for a, b in zip(cover, cover[1:])), d  # no gap, no overlap
    assert {c.rank for c in p.copies if c.dst == "q"} == {1}  # rows 4-7 of q live on rank 1 only
    o = [c for c in p.copies if c.dst == "o"]  # column block 0 of a (6, 8): one strided copy per rank
    assert [(c.rank, c.count, c.n, c.src_stride, c.dst_stride) for c in o] == [(0, 3, 4, 8, 4), (1, 3, 4, 8, 4)]
    with pytest.raises(ValueError, match="equal blocks"):
        plan(lay, [Dest.of(Slice("odd", 0, 0, 2))])
    with pytest.raises(ValueError, match="no tensor"):
        plan(lay, [Dest.of(Slice("nope"))])
    with pytest.raises(ValueError, match="concatenate"):
        plan(lay, [Dest("x", (Slice("q"), Slice("o")))])


def test_shard_tensors_are_views_of_the_live_partition():
    t = model()
    lay = zero3_layout(specs(t), 2)
    live = partitions(t, 2, 1)
    out = shard_tensors(lay, 1, live)
    assert out["q"].data_ptr() == live["q"].data_ptr() and out["odd"].numel() == 3 and out["one"].numel() == 0
    assert parse_record(out[LAYOUT_TENSOR].numpy().tobytes())[2] == 1
    with pytest.raises(E.BufferMismatchError, match="partition of 'q'"):
        shard_tensors(lay, 1, {**live, "q": live["q"][:5]})


def exact(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                       b.reshape(-1).view(torch.uint8))


def test_sharded_publish_read_whole_tp_slices_and_fused_qkv(make_client):
    t = model(3)
    lay = zero3_layout(specs(t), 2)
    ranks = [make_client(name=f"trainer{r}") for r in range(2)]
    lives = [partitions(t, 2, r) for r in range(2)]
    publish_shard(ranks[0], "policy", 1, lay, 0, lives[0])
    assert ranks[0].latest("policy") is None  # transactional: not visible until every rank published
    publish_shard(ranks[1], "policy", 1, lay, 1, lives[1])
    assert ranks[0].latest("policy") == 1
    part_bytes = {ranks[r].worker_id: sum(p.length * t[p.name].element_size() for p in lay.ranks[r])
                  + len(record(lay, r)) for r in range(2)}

    whole = ReshardReader(make_client(name="whole"), "policy", lay).read_whole("latest")
    assert whole.version == 1 and all(exact(whole.tensors[n], t[n]) for n in t)
    assert whole.bytes_by_source == part_bytes  # each rank served its own partition once: no gathered copy

    for k in range(2):  # a TP=2 reader group: q/k/v/qkv row blocks, o column blocks
        dests = [Dest("qkv", (Slice("q", 0, k, 2), Slice("k", 0, k, 2), Slice("v", 0, k, 2))),
                 Dest.of(Slice("o", 1, k, 2)), Dest.of(Slice("odd"))]
        got = ReshardReader(make_client(name=f"tp{k}"), "policy", lay).read(1, dests)
        qkv = torch.cat([t[n].chunk(2, 0)[k] for n in ("q", "k", "v")])
        assert exact(got.tensors["qkv"], qkv) and exact(got.tensors["o"], t["o"].chunk(2, 1)[k].contiguous())
        assert exact(got.tensors["odd"], t["odd"]) and got.version == 1
        assert sum(got.bytes_by_source.values()) == sum(part_bytes.values())

    # A second whole reader may be served by the first (it holds both shards, as the trainer does).
    again = ReshardReader(make_client(name="whole2"), "policy", lay).read_whole(1)
    assert all(exact(again.tensors[n], t[n]) for n in t)
    assert sum(again.bytes_by_source.values()) == sum(part_bytes.values())


def test_a_reader_with_another_layout_is_refused(make_client):
    t = model(4)
    lay = zero3_layout(specs(t), 2)
    for r in range(2):
        publish_shard(make_client(name=f"trainer{r}"), "policy", 1, lay, r, partitions(t, 2, r))
    other = zero3_layout({**specs(t), "odd": ((7,), "float16")}, 2)  # same sizes, another dtype
    with pytest.raises(E.HubError):
        ReshardReader(make_client(name="r"), "policy", other).read_whole(1)


def test_a_tp_reader_moves_only_the_units_of_its_ranges(make_client):
    """With 16-byte units (every half row of `o` is one unit) a TP=2 reader moves only the units that
    hold its slices: counted here independently of the planner, from masks of the full tensors."""
    from rlsync.hub.model.manifest import ManifestConfig

    t = model(5)
    lay = zero3_layout(specs(t), 2)
    ranks = [make_client(name=f"trainer{r}") for r in range(2)]
    tiny = ManifestConfig(chunk_bytes=16, pack_below=0, pack_bytes=16)
    for r in range(2):
        publish_shard(ranks[r], "policy", 1, lay, r, partitions(t, 2, r), units=tiny)
    whole_bytes = sum(p.length * t[p.name].element_size() for r in range(2) for p in lay.ranks[r])
    for k in range(2):
        dests = [Dest("qkv", (Slice("q", 0, k, 2), Slice("k", 0, k, 2), Slice("v", 0, k, 2))),
                 Dest.of(Slice("o", 1, k, 2)), Dest.of(Slice("odd"))]
        got = ReshardReader(make_client(name=f"tp{k}"), "policy", lay).read(1, dests)
        qkv = torch.cat([t[n].chunk(2, 0)[k] for n in ("q", "k", "v")])
        assert exact(got.tensors["qkv"], qkv) and exact(got.tensors["o"], t["o"].chunk(2, 1)[k].contiguous())
        assert exact(got.tensors["odd"], t["odd"])
        masks = {n: torch.zeros(t[n].shape, dtype=torch.bool) for n in ("q", "k", "v", "o", "odd")}
        for n in ("q", "k", "v"):
            masks[n].chunk(2, 0)[k].fill_(True)
        masks["o"].chunk(2, 1)[k].fill_(True)
        masks["odd"].fill_(True)
        want, data = {}, 0
        for r in range(2):  # bytes of every 16-byte unit of rank r's pieces that holds a needed element
            n_bytes = len(record(lay, r))  # the layout record always moves
            for p in lay.ranks[r]:
                if p.name not in masks or not p.length:
                    continue
                size = t[p.name].element_size()
                need = masks[p.name].reshape(-1)[p.start:p.start + p.length]
                for off in range(0, p.length * size, 16):
                    ln = min(16, p.length * size - off)
                    if need[off // size:(off + ln) // size].any():
                        n_bytes, data = n_bytes + ln, data + ln
            want[ranks[r].worker_id] = n_bytes
        assert got.bytes_by_source == want
        assert data < 0.6 * whole_bytes  # about half the model's bytes (odd is read whole), not all of it


def test_a_partial_reader_is_never_planned_as_a_source(make_client, caplog):
    """A partial reader asks with relay=false: while its fetch is open the hub plans another reader only on
    whole holders (before: on the partial reader too, which then had to refuse it as a failed relay)."""
    from rlsync.hub.model.shard import Shard

    src = {"w": torch.arange(64, dtype=torch.float32), "b": torch.ones(64)}
    make_client(host="h0", name="trainer").publish("m", 1, src)
    partial, other = make_client(host="h1", name="partial"), make_client(host="h1", name="other")
    seen = {}

    def want(manifest):  # runs while the partial reader's fetch is open
        got = other.fetch("m", 1)
        seen.update(got.bytes_by_source, exact=all(exact(got.tensors[n], src[n]) for n in src))
        return [0]

    into = {n: torch.zeros_like(t) for n, t in src.items()}
    res = partial.fetch_units("m", 1, Shard(), into, want)
    assert seen.pop("exact") and partial.worker_id not in seen  # never planned on it, not even for 0 bytes
    assert not any("re-planning" in r.getMessage() for r in caplog.records)
    assert sum(seen.values()) == 512 and res.units == [0] and all(exact(into[n], src[n]) for n in src)
