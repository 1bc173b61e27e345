"""Sharded layouts are checked, and every refusal of the resharding and versions APIs is typed (issue 30,
items 2 and 7).

On 0f12831 a layout whose pieces left rows 40-49 of a tensor in no rank's piece was published and
read as success (those rows uninitialized memory), a piece past the tensor's end failed at read with
a RuntimeError, two ranks could publish one version in different layouts, `ReshardReader.read` refused
bad destinations with plain ValueErrors (and silently kept one of two destinations of one name), and
`versions()["held"]` listed uncommitted versions and versions a shard of which nobody held.
"""
from __future__ import annotations

import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.reshard.layout import Dest, FlatPiece, ShardedLayout, Slice, zero3_layout
from rlsync.hub.reshard.read import ReshardReader, publish_shard, zero_shard

ROWS, COLS = 100, 4
W = torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)
B = torch.arange(8, dtype=torch.float32)


def rows_layout(split: int, shape=(ROWS, COLS), b_dtype: str = "float32", ends=None) -> ShardedLayout:
    """`w` cut by rows: rank 0 [0, split), rank 1 [split, ROWS) (or [ends[0], ends[1]) as given);
    `b` (8 elements) all on rank 0."""
    lo, hi = ends or (split, ROWS)
    return ShardedLayout("rows", 2, (
        (FlatPiece("w", "float32", shape, 0, split * COLS, 0), FlatPiece("b", b_dtype, (8,), 0, 8, 0)),
        (FlatPiece("w", "float32", shape, lo * COLS, (hi - lo) * COLS, 0), FlatPiece("b", b_dtype, (8,), 8, 0, 0))))


def live(layout: ShardedLayout, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s partitions of W and B as `layout` cuts them (copies: a trainer's live tensors)."""
    full = {"w": W, "b": B}
    return {p.name: full[p.name].reshape(-1)[p.start:p.start + p.length].to(getattr(torch, p.dtype)).clone()
            for p in layout.ranks[rank]}


def held_on_hub(hub, wid: str) -> list[str]:
    return sorted(r for r, rec in hub.server.state.replicas.items() if rec.worker == wid)


# ----------------------------------------------------------------------------- item 2: layouts tile
@pytest.mark.parametrize("case", ["gap", "overlap", "past the end", "gap at the end", "dtype", "shape"])
def test_a_layout_that_does_not_tile_is_refused_when_built(case):
    def piece(shape=(ROWS, COLS), dtype="float32", start=0, rows=ROWS):
        return FlatPiece("w", dtype, shape, start, rows * COLS, 0)

    ranks = {"gap": (piece(rows=40), piece(start=50 * COLS, rows=50)),   # rows 40-49 in nobody's piece
             "overlap": (piece(rows=60), piece(start=50 * COLS, rows=50)),
             "past the end": (piece(rows=50), piece(start=50 * COLS, rows=60)),
             "gap at the end": (piece(rows=50), piece(start=50 * COLS, rows=40)),
             "dtype": (piece(rows=50), piece(dtype="bfloat16", start=50 * COLS, rows=50)),
             "shape": (piece(rows=50), piece(shape=(COLS, ROWS), start=50 * COLS, rows=50))}[case]
    with pytest.raises(E.HubError) as err:
        ShardedLayout("rows", 2, tuple((p,) for p in ranks))
    assert err.value.code == "layout" and "w" in str(err.value), err.value
    if case == "gap":
        assert "rows [40, 50)" in str(err.value)
    assert ShardedLayout("rows", 2, ((piece(rows=50),), (piece(start=50 * COLS, rows=50),))).world == 2
    assert zero3_layout({"w": ((ROWS, COLS), "float32"), "one": ((1,), "float32")}, 3).world == 3


@pytest.mark.parametrize("case", ["gap", "overlap", "dtype", "shape"])
@pytest.mark.parametrize("first", [0, 1])
def test_ranks_publishing_other_layouts_of_one_version_are_refused_whichever_publishes_first(make_client, case, first):
    """Each rank's layout tiles on its own, but rank 0's piece and rank 1's piece (as their own layouts
    cut them) leave a gap, overlap, or disagree on a dtype or shape: the later publish is refused, typed,
    with nothing registered on the hub or the client, and the version stays invisible."""
    mine = rows_layout(40 if case == "gap" else 60 if case == "overlap" else 50)
    theirs = rows_layout(50, shape=(COLS * 2, ROWS // 2) if case == "shape" else (ROWS, COLS),
                         b_dtype="bfloat16" if case == "dtype" else "float32")
    layouts = [mine, theirs]
    ranks = [make_client(name=f"trainer{r}") for r in range(2)]
    second = 1 - first
    publish_shard(ranks[first], "policy", 1, layouts[first], first, live(layouts[first], first))
    with pytest.raises(E.LayoutError, match="same ShardedLayout"):
        publish_shard(ranks[second], "policy", 1, layouts[second], second, live(layouts[second], second))
    assert ranks[second].held() == [] and ranks[first].latest("policy") is None
    assert ranks[first].stats()["replicas"] == 1  # the first rank's shard only
    # Published in the first rank's layout, the second rank's shard commits the version: read bit-exact.
    publish_shard(ranks[second], "policy", 1, layouts[first], second, live(layouts[first], second))
    got = ReshardReader(make_client(name="reader"), "policy", layouts[first]).read_whole("latest")
    assert got.version == 1 and torch.equal(got.tensors["w"].reshape(-1), W.reshape(-1))


def test_a_reader_of_another_layout_is_refused_before_any_byte_moves(hub, make_client):
    """The version was published in one layout; a reader built another with pieces of the same sizes
    and a record of the same length (another kind): on 0f12831 shard 0 landed in the reader's buffers
    (and was registered as held) before its layout record was found to differ. Now the hub refuses it
    before planning: its buffers are untouched and it holds nothing."""
    lay = rows_layout(50)
    for r in range(2):
        publish_shard(make_client(name=f"trainer{r}"), "policy", 1, lay, r, live(lay, r))
    other = ShardedLayout("fsdp", 2, lay.ranks)
    reader = make_client(name="reader")
    into = {"w": torch.full((ROWS, COLS), -7.0), "b": torch.full((8,), -7.0)}
    with pytest.raises(E.HubError):
        ReshardReader(reader, "policy", other).read_whole(1, into=into)
    with pytest.raises(E.HubError):
        ReshardReader(reader, "policy", other).read(1, [Dest.of(Slice("w", 0, 1, 2))])
    assert all(bool((t == -7.0).all()) for t in into.values())
    assert reader.held() == [] and held_on_hub(hub, reader.worker_id) == []
    assert hub.server.state.fetches == {}


# ----------------------------------------------------------------------------- item 7: typed refusals
BAD_DESTS = {
    "uneven block": [Dest.of(Slice("b", 0, 0, 3))],            # 8 rows into 3 equal blocks
    "unknown tensor": [Dest.of(Slice("nope"))],
    "part 5 of 2": [Dest.of(Slice("w", 0, 5, 2))],
    "mixed dtypes in a fused destination": [Dest("wb", (Slice("w16"), Slice("w")))],
    "empty destination list": [],
    "a destination with no slices": [Dest("x", ())],
    "two destinations of one name": [Dest.of(Slice("w", 0, 0, 2), "x"), Dest.of(Slice("w", 0, 1, 2), "x")],
    "a whole tensor with a block number": [Dest.of(Slice("w", None, 1, 2))],
    "every destination empty": [Dest.of(Slice("empty"))],
}


@pytest.mark.parametrize("case", sorted(BAD_DESTS))
def test_bad_destinations_are_refused_typed_and_change_nothing(hub, make_client, case):
    specs = {"w": ((ROWS, COLS), "float32"), "w16": ((ROWS, COLS), "bfloat16"), "b": ((8,), "float32"),
             "empty": ((0, COLS), "float32")}
    lay = zero3_layout(specs, 2)
    tensors = {"w": W, "w16": W.to(torch.bfloat16), "b": B, "empty": torch.empty(0, COLS)}
    for r in range(2):
        part = {p.name: tensors[p.name].reshape(-1)[p.start:p.start + p.length + p.padding].clone()
                if not p.padding else torch.zeros(p.length + p.padding, dtype=tensors[p.name].dtype)
                for p in lay.ranks[r]}
        publish_shard(make_client(name=f"trainer{r}"), "policy", 1, lay, r, part)
    reader = make_client(name="reader")
    with pytest.raises(E.HubError) as err:
        ReshardReader(reader, "policy", lay).read(1, BAD_DESTS[case])
    assert err.value.code == "layout", err.value
    assert reader.held() == [] and held_on_hub(hub, reader.worker_id) == [] and hub.server.state.fetches == {}


def test_publish_shard_of_a_rank_outside_the_world_is_typed(make_client):
    lay = rows_layout(50)
    c = make_client(name="trainer")
    for rank in (2, -1):
        with pytest.raises(E.ShardError, match="outside"):
            publish_shard(c, "policy", 1, lay, rank, live(lay, 0))
    assert c.held() == []


# ----------------------------------------------------------------------------- item 7: versions()["held"]
def test_versions_held_lists_only_committed_versions_every_shard_of_which_is_held(make_client):
    lay = rows_layout(50)
    ranks = [make_client(name=f"trainer{r}") for r in range(2)]
    for r in range(2):
        publish_shard(ranks[r], "policy", 1, lay, r, live(lay, r))
    assert ranks[0].versions("policy")["held"] == [1]
    publish_shard(ranks[0], "policy", 2, lay, 0, live(lay, 0))  # rank 1 has not published v2: uncommitted
    v = ranks[0].versions("policy")
    assert v["committed"] == [1] and v["held"] == [1]
    publish_shard(ranks[1], "policy", 2, lay, 1, live(lay, 1))
    assert ranks[0].versions("policy")["held"] == [1, 2]
    ranks[1].release("policy", 1, shard=zero_shard(1, 2))  # v1 left retention: its shard 1 may go
    v = ranks[0].versions("policy")
    assert v["committed"] == [1, 2] and v["held"] == [2], v  # v1's shard 0 alone is not a replica of v1
