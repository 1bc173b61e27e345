"""`arithmetic_retry`: a multi-turn task. The model answers a sum; unless the reply is exactly the right
number the environment says so and asks again, up to `max_turns` replies. Reward: the last reply's
`number_format` score times `retry_discount` per earlier reply, so a right first answer beats a right retry.

    task = build_task("arithmetic_retry", tokenizer, max_operand=9, ops="+")
    env = task.make_env(); env.reset(task.prompt_at(0))
    env.step("3 + 4 = 7")   # EnvStep(text="That is not just the right number. What is 3 + 4? Answer ...", done=False)
    env.step("7")           # EnvStep(done=True, reward=0.8)

The environment's turns are user turns in the chat template; only the model's replies are trained
(episodes.py). Prompt i is `arithmetic`'s prompt i.
"""

from __future__ import annotations

from dataclasses import dataclass

from .environment import Environment, EnvStep
from .tasks import ArithmeticTask, register_task


class RetryEnv(Environment):
    def __init__(self, task: "ArithmeticRetryTask"):
        self.task, self.turns, self.last = task, 0, 0.0

    def step(self, reply: str) -> EnvStep:
        c = self.task.config
        score = self.task._reward(self.prompt, [], reply)
        self.last = score * c.retry_discount ** self.turns
        self.turns += 1
        if score >= 1.0 or self.turns >= c.max_turns:
            return EnvStep(done=True, reward=self.last)
        return EnvStep(text=f"That is not just the right number. {self.prompt.info['question']}")

    def finish(self) -> float:
        return self.last


@register_task("arithmetic_retry")
class ArithmeticRetryTask(ArithmeticTask):
    multi_turn = True

    @dataclass(kw_only=True)
    class Config(ArithmeticTask.Config):
        reward: str = "number_format"
        """Registered reward that scores each reply (1.0: exactly the right number)."""
        max_turns: int = 2
        """Model replies per episode: the first answer plus retries."""
        retry_discount: float = 0.8
        """A reply's score is multiplied by this once per earlier reply."""

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    def make_env(self) -> RetryEnv:
        return RetryEnv(self)
