"""Tasks: deterministic prompt streams with a verifier, and their registry.

A task's prompt number i depends only on (seed, i), so the data cursor is the whole of its state:

    task = build_task("reverse", seed=0)
    ps = task.next_prompts(32)             # prompts 0..31, cursor -> 32
    task.state_dict()                      # {"cursor": 32}; load it into a fresh task to resume
    task.score(ps[0], response_ids)        # reward in [0, 1] from the task's registered reward

Built in:
- `reverse` / `successor`: the default tasks for a tiny random-init model. Prompt `<bos> x y z <sep>`
  over 12 symbols (vocab 16 with the specials); answer `z y x <eos>` (reverse) or each symbol's
  cyclic successor (successor), scored with partial credit (share of the 4 positions right).
- `arithmetic`: "What is a + b?" for a real small instruct model (SmolLM2), scored on the number.
- From the ecosystem (optional extras, `pip install -e .[tasks]`): `reasoning_gym` (any reasoning-gym
  generator, task_reasoning_gym.py) and `verifiers` (a verifiers taskset/environment, task_verifiers.py).

Multi-turn tasks (`multi_turn = True`) also open one `Environment` per sample (environment.py); the
rollout worker's episode loop (episodes.py) alternates model and environment turns.

Simplifies: one prompt format per task, no dataset files.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any

from rlsync.core.registry import Registry

from .rewards import REWARDS, Prompt, get_reward
from .tokenizer import CharTokenizer

TASKS: Registry = Registry("task")
register_task = TASKS.register
get_task = TASKS.get


class Task:
    @dataclass(kw_only=True)
    class Config:
        seed: int = 0
        """Seed of the prompt stream: prompt i is a pure function of (seed, i)."""
        reward: str = "partial_match"
        """Registered reward function that scores responses."""

    def __init__(self, config: "Task.Config | None" = None, tokenizer: Any = None):
        self.config = config if config is not None else self.Config()
        self.tokenizer = tokenizer
        self.cursor = 0
        """Index of the next prompt `next_prompts` hands out."""
        self._reward = get_reward(self.config.reward)

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        """Refuse `task.args` this task cannot run with, naming the key (called when the run's config is
        composed, before anything starts): here the reward's name; tasks add their own checks."""
        REWARDS.check(args.get("reward", cls.Config.reward), "task.args.reward")

    def prompt_at(self, index: int) -> Prompt:
        """Prompt number `index` of the stream."""
        raise NotImplementedError

    def rng_at(self, index: int) -> random.Random:
        # Seeded per prompt (not one running RNG) so any index can be produced without the ones before.
        return random.Random(self.config.seed * 1_000_003 + index)

    def next_prompts(self, n: int) -> list[Prompt]:
        out = [self.prompt_at(self.cursor + i) for i in range(n)]
        self.cursor += n
        return out

    def score(self, prompt: Prompt, response_ids: list[int]) -> float:
        return self._reward(prompt, response_ids, self.tokenizer.decode(response_ids))

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor, "seed": self.config.seed}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        if sd.get("seed", self.config.seed) != self.config.seed:
            raise ValueError(f"task state is from seed {sd['seed']}, this task has seed {self.config.seed}")
        self.cursor = int(sd["cursor"])


def text_prompt(tokenizer: Any, text: str, *, chat_template: bool = True,
                system: str | None = None) -> tuple[str, list[int]]:
    """(text as the model sees it, its ids): in the tokenizer's chat template when asked and it has one
    (instruct models), `<bos> text <sep>` for the tiny model's `CharTokenizer`, else the plain text."""
    if isinstance(tokenizer, CharTokenizer):
        return text, [tokenizer.bos_token_id, *tokenizer.encode(text), tokenizer.sep_token_id]
    if chat_template and hasattr(tokenizer, "apply_chat_template"):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode_response(tokenizer: Any, ids: list[int]) -> str:
    """A response's text without special tokens (`CharTokenizer.decode` stops at <eos> itself)."""
    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.decode(ids)
    return tokenizer.decode(ids, skip_special_tokens=True)


def text_tokenizer(tokenizer: Any) -> Any:
    """The model's tokenizer, or for the tiny model one token per printable ASCII character."""
    return tokenizer if tokenizer is not None else CharTokenizer(string.printable)


def build_task(name: str, tokenizer: Any = None, **config: Any) -> Task:
    cls = get_task(name)
    return cls(cls.Config(**config), tokenizer)


class SymbolTask(Task):
    """`<bos> x1..xn <sep>` -> f(x1..xn) `<eos>`, over a small alphabet, partial credit per position."""

    @dataclass(kw_only=True)
    class Config(Task.Config):
        symbols: str = "abcdefghijkl"
        """Alphabet; the vocab is these plus 4 special tokens."""
        length: int = 3
        """Symbols per prompt."""

    def __init__(self, config: "SymbolTask.Config | None" = None, tokenizer: Any = None):
        super().__init__(config, tokenizer)
        self.tokenizer = tokenizer or CharTokenizer(self.config.symbols)

    @property
    def response_len(self) -> int:
        """Tokens of a perfect answer, including <eos>: the max_new_tokens to sample."""
        return self.config.length + 1

    def transform(self, xs: str) -> str:
        raise NotImplementedError

    def prompt_at(self, index: int) -> Prompt:
        rng = self.rng_at(index)
        xs = "".join(rng.choice(self.config.symbols) for _ in range(self.config.length))
        tok = self.tokenizer
        return Prompt(index=index, text=xs, prompt_ids=[tok.bos_token_id, *tok.encode(xs), tok.sep_token_id],
                      answer=[*tok.encode(self.transform(xs)), tok.eos_token_id])


@register_task("reverse")
class ReverseTask(SymbolTask):
    def transform(self, xs: str) -> str:
        return xs[::-1]


@register_task("successor")
class SuccessorTask(SymbolTask):
    def transform(self, xs: str) -> str:
        s = self.config.symbols
        return "".join(s[(s.index(ch) + 1) % len(s)] for ch in xs)


@register_task("arithmetic")
class ArithmeticTask(Task):
    """Small-number addition/subtraction in a chat prompt, for a pretrained instruct model."""

    @dataclass(kw_only=True)
    class Config(Task.Config):
        reward: str = "number_match"
        """Registered reward function that scores responses."""
        max_operand: int = 20
        """Operands are drawn from [0, max_operand]."""
        ops: str = "+-"
        """Operators to draw from."""
        chat_template: bool = True
        """Wrap the question in the tokenizer's chat template (instruct models)."""

    def __init__(self, config: "ArithmeticTask.Config | None" = None, tokenizer: Any = None):
        if tokenizer is None:
            raise ValueError("the arithmetic task needs the model's tokenizer (see rollout.models.load_smollm2)")
        super().__init__(config, tokenizer)

    def prompt_at(self, index: int) -> Prompt:
        rng = self.rng_at(index)
        a, b = rng.randint(0, self.config.max_operand), rng.randint(0, self.config.max_operand)
        op = rng.choice(self.config.ops)
        question = f"What is {a} {op} {b}? Answer with just the number."
        text, ids = text_prompt(self.tokenizer, question, chat_template=self.config.chat_template)
        return Prompt(index=index, text=text, prompt_ids=ids, answer=a + b if op == "+" else a - b,
                      info={"question": question})

    def score(self, prompt: Prompt, response_ids: list[int]) -> float:
        return self._reward(prompt, response_ids, decode_response(self.tokenizer, response_ids))
