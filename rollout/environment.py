"""Multi-turn episodes: an `Environment` answers each model turn (a user or tool turn) until it is done.

    env = task.make_env()                  # one per sampled episode (a GRPO group opens group_size of them)
    env.reset(prompt)                      # the prompt the model sees first is prompt.prompt_ids
    env.step("12")                         # EnvStep(text="No. Reply with just the number.", done=False)
    env.step("13")                         # EnvStep(done=True, reward=0.8)
    env.finish()                           # the turn budget ran out first: the episode's reward now (default 0)
    env.close()                            # free what the session holds

A multi-turn task sets `multi_turn = True` and `max_turns`, and has `make_env()`; the rollout worker's
episode loop (episodes.py) calls the engine once per turn for all live episodes and trains only on the
model's tokens (an environment turn's tokens get response_mask 0). `env_turn_ids` renders an environment
turn the way the model's chat template would, so the sequence the trainer re-scores is the one sampled.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from .rewards import Prompt
from .tokenizer import CharTokenizer


@dataclass(kw_only=True)
class EnvStep:
    """The environment's answer to one model turn."""

    text: str = ""
    """Its reply, shown to the model as the next `role` turn (ignored when done)."""
    done: bool = False
    """The episode is over: no further model turn."""
    reward: float = 0.0
    """The episode's reward, read when done."""
    role: str = "user"
    """Chat role of the reply: `user` (feedback, a simulated user) or `tool` (a tool's result)."""


class Environment(ABC):
    """One episode's session. Not shared between episodes; `step` is called once per model turn."""

    def reset(self, prompt: Prompt) -> None:
        """Start the episode on `prompt` (the model's first turn answers `prompt.prompt_ids`)."""
        self.prompt = prompt

    @abstractmethod
    def step(self, reply: str) -> EnvStep:
        """Take the model's reply (decoded, special tokens dropped); answer, or end the episode."""

    def finish(self) -> float:
        """The reward of an episode stopped by the task's turn budget before `done`."""
        return 0.0

    def close(self) -> None:
        """Free what the session holds (after `done` or `finish`)."""


def env_turn_ids(tokenizer: Any, step: EnvStep, *, reply_ended: bool, eos_token_id: int) -> list[int]:
    """Tokens of an environment turn that follows a model reply, ending where the model speaks again.

    Chat tokenizers: the chat template's rendering of the turn after an assistant message (from just
    after the assistant's end token up to the next generation prompt), found as the template's own
    difference between a conversation with and without the turn. The tiny model's `CharTokenizer`:
    `text <sep>`. A reply cut off by the token budget (no end token) gets the end token first.
    """
    head = [] if reply_ended else [eos_token_id]
    if isinstance(tokenizer, CharTokenizer):
        return head + tokenizer.encode(step.text) + [tokenizer.sep_token_id]
    base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template(base + [{"role": step.role, "content": step.text}], tokenize=False,
                                          add_generation_prompt=True)
    eos = tokenizer.eos_token or ""
    cut = before.rindex(eos) + len(eos) if eos and eos in before else len(before)
    if after[:cut] != before[:cut]:
        raise ValueError("the chat template renders earlier turns differently once a turn is added: "
                         "cannot append an environment turn to the sampled tokens")
    return head + list(tokenizer(after[cut:], add_special_tokens=False)["input_ids"])
