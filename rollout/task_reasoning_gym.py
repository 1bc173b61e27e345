"""`reasoning_gym`: any reasoning-gym generator as a task, scored by the generator's own `score_answer`.

    task = build_task("reasoning_gym", tokenizer, dataset="basic_arithmetic",
                      dataset_args={"max_terms": 2, "max_digits": 1, "operators": ["+"]})
    p = task.prompt_at(0)        # the generator's item 0 under this task's seed: question + instruction
    task.score(p, response_ids)  # the generator's score_answer on the reply (its <answer> tag if it wrote one)

`python -m rlsync.train ... task.name=reasoning_gym task.args.dataset=NAME` selects it. reasoning-gym
(PyPI `reasoning-gym`, the `tasks` extra that scripts/run installs) is procedural: items are generated
from (seed, index), nothing is downloaded. Prompt i is the generator's item i of a dataset seeded from
`task.seed`, so the held-out eval (another seed) draws other items.

Simplifies: one question per prompt (no curriculum); the reply's `<answer>...</answer>` is used when
present, else the whole reply stripped (a 135M model seldom writes the tags).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from rlsync.core.errors import ConfigError
from rlsync.core.registry import UnknownNameError

from .rewards import Prompt, register_reward
from .tasks import Task, decode_response, register_task, text_prompt, text_tokenizer

EXTRA_HINT = "install the `tasks` extra: pip install -e .[tasks] (scripts/run does)"


class TaskLibraryMissingError(ConfigError):
    """An ecosystem task's library (reasoning-gym, verifiers) is not installed."""


def _rg():
    try:
        import reasoning_gym
    except ImportError:
        raise TaskLibraryMissingError(f"task.name=reasoning_gym needs the 'reasoning-gym' package: {EXTRA_HINT}") from None
    return reasoning_gym


@functools.lru_cache(maxsize=None)
def _scorer(dataset: str):
    return _rg().get_score_answer_fn(dataset)


def extract_answer(text: str) -> str:
    """The reply's last `<answer>...</answer>` if it wrote one, else the whole reply, stripped."""
    from reasoning_gym.utils import extract_answer as rg_extract

    tagged = rg_extract(text)
    return tagged if tagged is not None else text.strip()


@register_reward("reasoning_gym")
def reasoning_gym_score(prompt: Prompt, response_ids: list[int], response_text: str) -> float:
    """The generator's own `score_answer(answer, entry)` (partial credit where the generator gives it)."""
    entry = prompt.answer
    return float(_scorer(entry["metadata"]["source_dataset"])(extract_answer(response_text), entry))


@register_task("reasoning_gym")
class ReasoningGymTask(Task):
    @dataclass(kw_only=True)
    class Config(Task.Config):
        dataset: str = ""
        """reasoning-gym generator name (`reasoning_gym.factory.DATASETS`: basic_arithmetic, chain_sum, ...)."""
        dataset_args: dict[str, Any] = field(default_factory=dict)
        """The generator's own config fields, e.g. {max_terms: 2, operators: ["+"]} for basic_arithmetic."""
        size: int = 1_000_000
        """Items before the stream wraps (reasoning-gym's virtual dataset size)."""
        instruction: str = "Reply with just the final answer."
        """Appended to each question."""
        chat_template: bool = True
        """Wrap the prompt in the tokenizer's chat template (instruct models)."""
        reward: str = "reasoning_gym"
        """Registered reward; `reasoning_gym` is the generator's own scorer."""
        max_response_tokens: int = 16
        """Tokens sampled per reply when the pool sets none (`response_len`)."""

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        known = sorted(_rg().factory.DATASETS)
        if args.get("dataset") not in known:
            raise UnknownNameError("reasoning-gym dataset", str(args.get("dataset", "")), known, where="task.args.dataset")

    def __init__(self, config: "ReasoningGymTask.Config | None" = None, tokenizer: Any = None):
        super().__init__(config, tokenizer)
        c = self.config
        rg = _rg()
        self.check_args({"dataset": c.dataset, "reward": c.reward})
        # Seeds far apart per task.seed: reasoning-gym seeds item i with (seed + i).
        self.dataset = rg.create_dataset(c.dataset, seed=(c.seed * 1_000_003) % 2**32, size=c.size,
                                         **dict(c.dataset_args))
        self.tokenizer = text_tokenizer(tokenizer)

    @property
    def response_len(self) -> int:
        return self.config.max_response_tokens

    def prompt_at(self, index: int) -> Prompt:
        entry = self.dataset[index % self.config.size]
        question = f"{entry['question']}\n{self.config.instruction}".strip()
        text, ids = text_prompt(self.tokenizer, question, chat_template=self.config.chat_template)
        entry = {**entry, "metadata": {**entry["metadata"], "source_dataset": self.config.dataset}}
        return Prompt(index=index, text=text, prompt_ids=ids, answer=entry)

    def score(self, prompt: Prompt, response_ids: list[int]) -> float:
        return self._reward(prompt, response_ids, decode_response(self.tokenizer, response_ids))
