"""`sync.mode=hub` with a DeepSpeed ZeRO-3 trainer: each rank publishes its own live partition, no gather.

    layout = publish_zero3(hub, "policy", version, backend)   # every rank; commits when all have
    layout = reader_layout(model, world)                       # a reader's view of it

    publisher: every rank registers its flat partition as its shard of v (`publish_shard`, checksums on the
               client's publish thread while the rank goes on); `release()` waits for it before the step
    receiver:  `ReshardReader.read_whole("latest", into=engine.named_parameters_for_sync())`: each shard
               lands in place at its flat range (docs/resharding.md); a staged engine gets the layout

The glue between the trainer's backend (`named_partitions_for_sync`: the live flat partitions) and the
hub's resharding layer, which records how the partitions map onto the full parameters. Whether a run
publishes this way is `trainer.publish` (`auto`: wherever `HubSharded.misfit` finds nothing).
"""
from __future__ import annotations

from typing import Any

from rlsync.hub import ReshardReader, Shard, ShardedLayout, dtype_name, publish_shard, zero3_layout, zero_shard

from .base import Side, WeightPublisher, WeightSync, register_weight_sync
from .hub_full import HubReceiver


def zero3_layout_of(backend: Any) -> tuple[int, ShardedLayout, dict]:
    """(rank, the model's ZeRO-3 layout, name -> live partition) of a ZeRO-3 backend."""
    rank, world, parts = backend.named_partitions_for_sync()
    layout = zero3_layout({n: (shape, dtype_name(t.dtype)) for n, (t, shape) in parts.items()}, world)
    return rank, layout, {n: t for n, (t, _) in parts.items()}


def publish_zero3(hub: Any, model: str, version: int, backend: Any, wait: bool = True):
    """Publish this rank's live partition as its shard of `version`: the layout, or with
    `wait=False` (layout, the publish's future) — see `HubClient.publish_async`."""
    rank, layout, live = zero3_layout_of(backend)
    got = publish_shard(hub, model, version, layout, rank, live, wait=wait)
    return layout if wait else (layout, got)


def reader_layout(model: Any, world: int) -> ShardedLayout:
    """The layout a `world`-rank ZeRO-3 trainer publishes in, from a reader's own copy of the model (the
    same parameter names, shapes and dtypes as the trainer's module). Each shard's layout record is
    checked against it on every read (a mismatch is a ManifestMismatchError, never a wrong tensor)."""
    specs = {n: (tuple(p.shape), dtype_name(p.dtype)) for n, p in model.named_parameters()}
    return zero3_layout(specs, world)


def shard_of(layout: ShardedLayout | None, key: str) -> Shard:
    """The `Shard` of a held replica's shard key under `layout` (whole tensors: `Shard()`)."""
    shards = [zero_shard(r, layout.world) for r in range(layout.world)] if layout else [Shard()]
    for s in shards:
        if s.key == key:
            return s
    raise KeyError(f"shard {key!r} is not one of {[s.key for s in shards]}")


class HubShardedPublisher(WeightPublisher):
    all_ranks_join = True

    def publish(self, backend: Any) -> dict:
        v = backend.version
        rank, layout, live = zero3_layout_of(backend)
        n = sum(p.length * live[p.name].element_size() for p in layout.ranks[rank])
        # The checksum pass runs on the client's publish thread while this rank goes on (the next
        # forward/backward only reads the partition); release() waits for it before the step writes.
        publish_shard(self.hub, self.model, v, layout, rank, live, wait=False)
        self.shard, self.published = zero_shard(rank, layout.world), v
        self.clock.event("publish", version=v, bytes=n, shard=rank)
        return {"version": v, "bytes": n}

    def shapes(self, backend: Any) -> dict[str, tuple[int, ...]]:
        return {n: tuple(s) for n, (_, s) in backend.named_partitions_for_sync()[2].items()}  # no gather


class HubShardedReceiver(HubReceiver):
    def __init__(self, side: Side, engine: Any, *, params: Any = None, delay_s: float = 0.0):
        self.layout = reader_layout(params, side.shape.trainer_world_size)  # before the engine attaches
        super().__init__(side, engine, params=params, delay_s=delay_s)
        self.reader = ReshardReader(self.hub, self.model, self.layout)

    def _read(self):
        if self.caps.reads_hub:
            return self.engine.update_latest()
        self._release_held()
        return self.reader.read_whole("latest", into=self.engine.named_parameters_for_sync())

    def _shard_of(self, key: str) -> Shard:
        return shard_of(self.layout, key)


@register_weight_sync("hub_sharded")
class HubSharded(WeightSync):
    """ZeRO-3 partitions through the hub, read back as whole tensors (or any layout)."""

    mode, order, shards = "hub", 0, True
    publisher, receiver = HubShardedPublisher, HubShardedReceiver

    @classmethod
    def misfit(cls, sync, shape) -> str | None:
        if shape.backend != "deepspeed" or shape.zero_stage != 3:
            return (f"needs trainer.backend=deepspeed and trainer.zero_stage=3 "
                    f"(got {shape.backend}, stage {shape.zero_stage})")
        if shape.elastic_trainer:
            return "does not work with trainer.elastic.enabled (a re-formed group reads back whole tensors)"
        if shape.seed_dcs:
            return "does not work with hub.seed_dcs (seed workers follow whole versions)"
        if sync.deltas:
            return "does not work with sync.deltas (the trainer's deltas and the engines' delta reads are of whole versions)"
        return None
