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
    "ClientConfig": ".client.config", "FetchResult": ".client", "HubClient": ".client", "HubError": ".errors",
    "Location": ".model.location", "Manifest": ".model.manifest", "ManifestConfig": ".model.manifest", "PlannerConfig": ".state.planner",
    "RetentionConfig": ".state.retention", "EmbeddedHub": ".server.loop", "HubServer": ".server.loop",
    "start_embedded_hub": ".server.loop", "ReplicaId": ".model.replica_id", "Shard": ".model.shard", "HubConfig": ".state", "errors": ".errors",
    "positive_int": ".cli_args", "positive_float": ".cli_args", "transport_names": ".dataplane.transports",
    "ShardedLayout": ".reshard.layout", "zero3_layout": ".reshard.layout", "ReshardReader": ".reshard.read",
    "publish_shard": ".reshard.read", "zero_shard": ".reshard.read", "dtype_name": ".model.manifest",
    "Dest": ".reshard.layout", "Slice": ".reshard.layout", "dtype_from_name": ".model.manifest",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Lazy: `python -m rlsync.hub serve` must not pay for importing torch (hub restarts are failover time).
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rlsync.hub' has no attribute {name!r}")
    mod = import_module(_EXPORTS[name], __name__)
    return mod if name == "errors" else getattr(mod, name)
