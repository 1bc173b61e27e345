"""Reward functions (rule-based verifiers) and their registry.

A reward function scores one response to one prompt, in [0, 1]:

    @register_reward("partial_match")
    def partial_match(prompt: Prompt, response_ids: list[int], response_text: str) -> float: ...

    get_reward("partial_match")(prompt, [6, 5, 9, 2], "cbx")   # target "cba"+<eos> -> 3/4 right = 0.75

Partial credit matters: from random init an all-or-nothing multi-token reward is almost always 0,
so every GRPO group has zero spread and there is no gradient (ENVIRONMENT.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from rlsync.core.registry import Registry


@dataclass(kw_only=True)
class Prompt:
    """One prompt of a task's stream, with what its verifier needs."""

    index: int
    """Position in the task's deterministic stream (the data cursor)."""
    text: str
    """Human-readable prompt."""
    prompt_ids: list[int]
    """Token ids fed to the model."""
    answer: Any
    """Ground truth for the verifier (target token ids, or a number)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What else a multi-turn environment needs to play this prompt (e.g. the question to ask again)."""


RewardFn = Callable[[Prompt, list[int], str], float]
REWARDS: Registry = Registry("reward")
register_reward = REWARDS.register
get_reward = REWARDS.get


@register_reward("partial_match")
def partial_match(prompt: Prompt, response_ids: list[int], response_text: str) -> float:
    """Share of target positions (answer ids, then the end token) the response gets right, in order."""
    target: list[int] = prompt.answer
    hits = sum(1 for i, t in enumerate(target) if i < len(response_ids) and response_ids[i] == t)
    return hits / len(target)


_INT = re.compile(r"-?\d+")


@register_reward("number_match")
def number_match(prompt: Prompt, response_ids: list[int], response_text: str) -> float:
    """1 if the first integer in the response equals the answer, else 0."""
    m = _INT.search(response_text.replace(",", ""))
    return 1.0 if m is not None and int(m.group()) == int(prompt.answer) else 0.0


_JUST_NUMBER = re.compile(r"-?\d+\.?")


@register_reward("number_format")
def number_format(prompt: Prompt, response_ids: list[int], response_text: str) -> float:
    """Correctness with partial credit for format, for "Reply with just the number" prompts:
    0.5 if the response starts with the right number, + 0.3 if it is just a number (a trailing period
    allowed), + 0.2 if it starts with a number at all. 1.0 only for exactly the right number.

    A pretrained instruct model (SmolLM2-135M) starts near 0.2: it often writes "3 + 4 = 7" or a sentence,
    whose first number is an operand; the format terms give GRPO a gradient towards answering with the
    number, and the model knows single-digit sums once it does (docs/real_model.md).
    """
    t = response_text.strip()
    m = _INT.match(t)
    if m is None:
        return 0.0
    right = int(m.group()) == int(prompt.answer)
    just = _JUST_NUMBER.fullmatch(t) is not None
    return 0.2 + 0.3 * just + 0.5 * right
