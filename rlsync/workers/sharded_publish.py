"""Sharded publish for a ZeRO-3 trainer: each rank publishes its own live partition, no gather.

    layout = publish_zero3(hub, "policy", version, backend)   # every rank; commits when all have

The glue between the trainer's backend (`DeepSpeedBackend.named_partitions_for_sync`: the live
flat partitions) and the hub's resharding layer (rlsync.hub.reshard_read), which records how the
partitions map onto the full parameters and lets readers of any layout fetch from them.
"""
from __future__ import annotations

from rlsync.hub.manifest import dtype_name
from rlsync.hub.reshard import ShardedLayout, zero3_layout
from rlsync.hub.reshard_read import publish_shard


def zero3_layout_of(backend) -> tuple[int, ShardedLayout, dict]:
    """(rank, the model's ZeRO-3 layout, name -> live partition) of a ZeRO-3 backend."""
    rank, world, parts = backend.named_partitions_for_sync()
    layout = zero3_layout({n: (shape, dtype_name(t.dtype)) for n, (t, shape) in parts.items()}, world)
    return rank, layout, {n: t for n, (t, _) in parts.items()}


def publish_zero3(hub, model: str, version: int, backend) -> ShardedLayout:
    rank, layout, live = zero3_layout_of(backend)
    publish_shard(hub, model, version, layout, rank, live)
    return layout
