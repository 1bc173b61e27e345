"""`serving_gc()`: a serving process's garbage-collector policy, so no request pays a full collection.

    engine = build_engine(...); hub = HubClient(...); receiver = route.receiver(...)
    serving_gc()        # once, after start-up: the process then serves requests

A full (generation 2) collection walks every tracked object in the process. A rollout worker holds the model,
torch's and transformers' object graphs and the hub client's records (with 128 adapters resident: ~0.4 M objects
after start-up, ~0.25 M more made by the adapters' records), and Python's default thresholds (700, 10, 10) start
such a pass every few thousand container allocations: in `bench tenants` one pass took 105-477 ms on one core and
landed on whatever the process was doing, a publish or a fetch on the way to a first token (docs/lora.md).

`gc.freeze()` moves everything alive at start-up into the permanent generation, never scanned again (what vLLM
does after its start-up too); thresholds like the standalone hub's (`hub/server/loop.py` `serving_gc`) make the
full passes over what is made later rare. Cycles made later are still collected. Process-wide: call it in a
process that serves (the rollout worker, the bench), not in a library constructor.
"""
from __future__ import annotations

import gc

THRESHOLDS = (10_000, 50, 100)
"""gen0 allocations, gen0 passes per gen1 pass, gen1 passes per full pass (Python's defaults: 700, 10, 10)."""


def serving_gc() -> None:
    """Collect once, freeze what is alive (start-up), and raise the collection thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
