"""rlsync.sync: the one owner of the weights' path, from the trainer ranks into every rollout engine.

    base.py          WeightPublisher (publish / release / recover) · WeightReceiver (ensure(min_version) /
                     prefetch) · SyncCoordinator (the driver's part) · SyncConfig · the route registry
                     (`@register_weight_sync`) and the run's choice (`choose_route`)
    engine.py        the engine side: `WeightEngine`, its declared `EngineCaps` (`caps_of`), never getattr probes
    hub_full.py      sync.mode=hub: whole versions (the default)
    hub_delta.py     sync.mode=hub, sync.deltas: plus each version's delta
    hub_sharded.py   sync.mode=hub, ZeRO-3 trainer: each rank's partition, read back whole
    hub_derived.py   sync.mode=hub, sync.variant=bf16|int8: a derived variant, made once, read from peers
    hub_adapter.py   sync.mode=hub, trainer.lora: the base once, then each version's LoRA adapter
    object_store.py  sync.mode=object_store: ray.put / ray.get (the verl/OpenRLHF baseline)
    broadcast.py     sync.mode=broadcast: one static gloo group (NCCL's shape)
    verify.py        what the engine computes with, checked after every apply (hub routes; docs/verify.md)

Room rule: imports `rlsync.core` and the hub's public face (`from rlsync.hub import ...`); never the
workers, the driver, the trainer or rollout rooms (pyproject's import contracts).
Each side is built from the `sync` section plus what it needs (hub client, model name, engine, clock),
never the whole run config.
"""
from . import broadcast, hub_adapter, hub_delta, hub_derived, hub_full, hub_sharded, object_store  # noqa: F401 - register the routes
from .base import (WEIGHT_SYNCS, RunShape, Side, SyncConfig, SyncCoordinator, SyncModeError, WeightPublisher,
                   WeightReceiver, WeightSync, choose_route, register_weight_sync, sync_modes)
from .engine import EngineCaps, EngineCapsError, WeightEngine, caps_of
from .verify import VerifyConfig, WeightsVerifyError

__all__ = ["EngineCaps", "EngineCapsError", "RunShape", "Side", "SyncConfig", "SyncCoordinator", "SyncModeError",
           "WEIGHT_SYNCS", "WeightEngine", "WeightPublisher", "WeightReceiver", "WeightSync", "caps_of",
           "choose_route", "register_weight_sync", "sync_modes", "VerifyConfig", "WeightsVerifyError"]
