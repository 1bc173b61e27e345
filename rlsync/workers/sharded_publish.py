"""Sharded publish for a ZeRO-3 trainer: each rank publishes its own live partition, no gather.

    layout = publish_zero3(hub, "policy", version, backend)   # every rank; commits when all have
    layout = reader_layout(cfg, model)                         # a reader's view of it (None: whole)

The glue between the trainer's backend (`DeepSpeedBackend.named_partitions_for_sync`: the live
flat partitions) and the hub's resharding layer (rlsync.hub.reshard_read), which records how the
partitions map onto the full parameters and lets readers of any layout fetch from them. Whether a
run publishes this way is `trainer.publish` (`rlsync.config_rules.sharded_publish`).
"""
from __future__ import annotations

from rlsync.config_rules import sharded_publish
from rlsync.hub.manifest import dtype_name
from rlsync.hub.reshard import ShardedLayout, zero3_layout
from rlsync.hub.reshard_read import publish_shard, zero_shard
from rlsync.hub.shard import Shard


def zero3_layout_of(backend) -> tuple[int, ShardedLayout, dict]:
    """(rank, the model's ZeRO-3 layout, name -> live partition) of a ZeRO-3 backend."""
    rank, world, parts = backend.named_partitions_for_sync()
    layout = zero3_layout({n: (shape, dtype_name(t.dtype)) for n, (t, shape) in parts.items()}, world)
    return rank, layout, {n: t for n, (t, _) in parts.items()}


def publish_zero3(hub, model: str, version: int, backend, wait: bool = True):
    """Publish this rank's live partition as its shard of `version`: the layout, or with
    `wait=False` (layout, the publish's future) — see `HubClient.publish_async`."""
    rank, layout, live = zero3_layout_of(backend)
    got = publish_shard(hub, model, version, layout, rank, live, wait=wait)
    return layout if wait else (layout, got)


def reader_layout(cfg, model) -> ShardedLayout | None:
    """The layout the run's trainer publishes in, built from a reader's own copy of the model (the
    same parameter names, shapes and dtypes as the trainer's module) and the trainer's world size;
    None when the trainer publishes whole tensors. Each shard's layout record is checked against it
    on every read (a mismatch is a ManifestMismatchError, never a wrong tensor)."""
    if not sharded_publish(cfg):
        return None
    specs = {n: (tuple(p.shape), dtype_name(p.dtype)) for n, p in model.named_parameters()}
    return zero3_layout(specs, cfg.trainer.world_size)


def shard_of(layout: ShardedLayout | None, key: str) -> Shard:
    """The `Shard` of a held replica's shard key under `layout` (whole tensors: `Shard()`)."""
    shards = [zero_shard(r, layout.world) for r in range(layout.world)] if layout else [Shard()]
    for s in shards:
        if s.key == key:
            return s
    raise KeyError(f"shard {key!r} is not one of {[s.key for s in shards]}")
