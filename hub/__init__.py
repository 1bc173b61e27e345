"""rlsync.hub — Reference-Oriented Storage: versions look stored; the hub stores no bytes.

Public API:
    start_embedded_hub, HubServer, HubConfig   — run a hub (in-process or `python -m rlsync.hub serve`)
    HubClient, ClientConfig, FetchResult       — publish / fetch / release from any training loop
    Location, Shard                            — where a worker is; which model-parallel shard
    ShardedLayout, zero3_layout, zero_shard,
    publish_shard, ReshardReader, dtype_name   — sharded publish (ZeRO-3 partitions) and whole reads of it
    ReplicaId                                  — which copy (worker, model, version, shard, slot)
    errors (HubError and subclasses)           — every refusal is typed
    positive_int, positive_float               — argparse types for CLIs (one-line errors, exit 2)
"""
from importlib import import_module

_EXPORTS = {
    "ClientConfig": ".client_config", "FetchResult": ".client", "HubClient": ".client", "HubError": ".errors",
    "Location": ".location", "Manifest": ".manifest", "ManifestConfig": ".manifest", "PlannerConfig": ".planner",
    "RetentionConfig": ".retention", "EmbeddedHub": ".server", "HubServer": ".server",
    "start_embedded_hub": ".server", "ReplicaId": ".replica_id", "Shard": ".shard", "HubConfig": ".state", "errors": ".errors",
    "positive_int": ".cli_args", "positive_float": ".cli_args",
    "ShardedLayout": ".reshard", "zero3_layout": ".reshard", "ReshardReader": ".reshard_read",
    "publish_shard": ".reshard_read", "zero_shard": ".reshard_read", "dtype_name": ".manifest",
    "Dest": ".reshard", "Slice": ".reshard", "dtype_from_name": ".manifest",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Lazy: `python -m rlsync.hub serve` must not pay for importing torch (hub restarts are failover time).
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlsync.hub' has no attribute {name!r}")
    mod = import_module(_EXPORTS[name], __name__)
    return mod if name == "errors" else getattr(mod, name)
