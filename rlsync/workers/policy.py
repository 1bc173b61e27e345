"""The policy model and task every process of a run builds the same way (same seed, same weights).

    model, task = build_policy(cfg)                       # the model loader `cfg.model.kind` builds it
    _, task = build_policy(cfg, tokenizer_only=True)      # the driver: prompts only

Model kinds are a registry (`rlsync.rollout.registry.MODEL_LOADERS`): adding one is one new file.
"""

from __future__ import annotations

from typing import Any

from rlsync.config import TrainConfig


def build_task(cfg: TrainConfig, tokenizer: Any = None):
    """The run's task (its own tokenizer for the symbol tasks; the model's for arithmetic)."""
    from rlsync.rollout import build_task as _build

    return _build(cfg.task.name, tokenizer, seed=cfg.task.seed, **dict(cfg.task.args))


def build_policy(cfg: TrainConfig, *, tokenizer_only: bool = False):
    """(model or None, task) as every process of the run builds them: same seed, same weights."""
    from rlsync.rollout import MODEL_LOADERS

    loader = MODEL_LOADERS.get(cfg.model.kind)()
    task = build_task(cfg, loader.tokenizer(cfg.model))
    if tokenizer_only:
        return None, task
    return loader.model(cfg.model, task.tokenizer, cfg.seed), task


def special_ids(task) -> tuple[int, int]:
    tok = task.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return pad, tok.eos_token_id

