"""`EngineCaps`: how weights can get into a rollout engine, as the engine declares it.

The rollout engines (rollout/engine.py, rollout/vllm/rl_engine.py) declare one as `sync_caps`; the weight-sync
routes (rlsync/sync/, `caps_of`, the `WeightEngine` protocol) read it. It lives in this low room because both
sides need it and the rollout room imports nothing of the hub or of rlsync.sync.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class EngineCaps:
    """How weights can get into an engine. Every engine declares one as `sync_caps`; the weight-sync routes
    (rlsync/sync/, `caps_of`) read only this and call the methods each capability names.

        RolloutEngine.sync_caps == EngineCaps(in_place_fetch=True, load_state=True)
    """

    in_place_fetch: bool = False
    """`named_parameters_for_sync()` returns the live tensors: the hub fetches straight into them."""
    load_state: bool = False
    """`load_state(tensors, version=v)` copies a whole version in from a name -> tensor mapping."""
    staged: bool = False
    """The engine reads the hub itself through its own staging replica: `attach_hub(hub, model, layout=)`,
    `update_latest()`, `apply_staged()` (a prefetched version: the only pause), `prefetch_latest()`, `close()`."""
    tp_sliced: bool = False
    """Several TP ranks each read only their slices of a version: `attach_hub`, `update_latest`, `close`
    (no prefetch: the read is inside the pause)."""

    inflight: bool = False
    """The engine takes a new version between two decode steps of a running `generate`, without draining:
    the receiver stages each version as it commits (`stage_version(v)` for an engine that reads the hub
    itself; a fetch into `next_buffers()` then `offer_next(v)` for one the hub fetches into), the engine
    builds it beside its live weights and swaps at the next step boundary; `start_inflight(kv_policy)`,
    `switch_prepared()` (between calls), `take_switches()` (the switches made inside `generate`).
    Its `Rollout.token_versions` say which version sampled each token."""

    verify: bool = False
    """The engine can show what it computes with (rlsync/sync/verify.py, docs/verify.md): `weights_readback()`
    (name -> the tensor its forward reads, after any conversion), `probe_logprobs(tokens)` and
    `compute_dtype`; an engine that reads the hub itself adds `verify_source()` (the manifest and staged
    tensors it applied from), `reapply(version)` (take it again, not from its own staging) and, staged,
    `verify_ahead(expect)` (the expected digests made as each version lands: the check then needs no staging)."""
    layout_variant: str | None = None
    """The derived variant whose tensor layout the engine was started in (`int8`: a vLLM engine loaded from the
    int8 W8A8 checkpoint); it takes only that variant. None: the model's own layout (the version as published,
    or a variant of the same layout such as `bf16`)."""
    adapters: bool = False
    """LoRA adapters over a base (`trainer.lora`, docs/lora.md): `enable_adapters(cfg, max_resident, extra)` gives
    the engine's `AdapterSlots` (the base's tensors, a slot per adapter key, LRU-bounded), `use_adapter(key, v)`."""

    @property
    def reads_hub(self) -> bool:
        """The engine takes a hub client and reads versions itself (staged or TP-sliced)."""
        return self.staged or self.tp_sliced
