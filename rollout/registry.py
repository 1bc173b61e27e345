"""The rollout room's registries: rollout engines (`rollout.engine`) and model loaders (`model.kind`).

Adding an engine or a model kind is one new file that registers it; nothing else is edited:

    @register_engine("vllm")
    def build_vllm_engine(sampling, model, *, pad_token_id, eos_token_id, model_cfg): ...

    @register_model_loader("my_model")
    class MyLoader(ModelLoader): ...

An engine factory gets the pool's sampling config (`pools.<name>.engine`, a `RolloutEngine.Config`),
the model the loader built (None when the loader builds none: an engine that loads its own copy),
the tokenizer's pad/eos ids and the run's `model` section; it returns an object with `version`,
`generate(prompt_ids) -> Rollout` and `sync_caps` (an `EngineCaps`: how weights may reach it, e.g.
`named_parameters_for_sync()`, the tensors the hub fetches into; rlsync/sync/engine.py).
Tasks and rewards have their registries beside them (tasks.py, rewards.py).
"""

from __future__ import annotations

from typing import Any

from rlsync.core.registry import Registry

ENGINES: Registry = Registry("rollout engine")
register_engine = ENGINES.register

MODEL_LOADERS: Registry = Registry("model loader")
register_model_loader = MODEL_LOADERS.register


def build_engine(name: str, sampling: Any, model: Any, *, pad_token_id: int, eos_token_id: int,
                 model_cfg: Any = None, variant: str | None = None) -> Any:
    """The rollout engine registered as `name` (`hf`, ...), built for one worker. `variant`: the derived variant
    whose layout it must start in (the route's `engine_variant`: `int8`; passed only to factories that take it)."""
    extra = {"variant": variant} if variant is not None else {}
    return ENGINES.get(name)(sampling, model, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                             model_cfg=model_cfg, **extra)
