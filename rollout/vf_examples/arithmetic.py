"""A verifiers taskset: "What is a + b?" with a `@vf.reward` rubric (1.0 exactly the number, 0.2 for
starting with a number, + 0.3 for a bare number: rlsync's `number_format`, as verifiers rewards)."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

import verifiers.v1 as vf

_INT = re.compile(r"-?\d+")


def number_format(reply: str, answer: int) -> float:
    m = _INT.match(reply.strip())
    if m is None:
        return 0.0
    return 0.2 + 0.3 * (re.fullmatch(r"-?\d+\.?", reply.strip()) is not None) + 0.5 * (int(m.group()) == answer)


class SumData(vf.TaskData):
    answer: int
    """The sum."""
    question: str
    """The question, asked again by the multi-turn env."""


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def number(self, trace: vf.Trace) -> float:
        return number_format(trace.last_reply, self.data.answer)


class SumConfig(vf.TasksetConfig):
    max_operand: int = 9
    """Operands are drawn from [0, max_operand]."""
    seed: int = 0
    """Seed of the task stream: task i is a pure function of (seed, i)."""


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    INFINITE = True
    task_cls: type[vf.Task] = SumTask

    def load(self) -> Iterator[SumTask]:
        i = 0
        while True:
            rng = random.Random(self.config.seed * 1_000_003 + i)
            a, b = rng.randint(0, self.config.max_operand), rng.randint(0, self.config.max_operand)
            q = f"What is {a} + {b}? Answer with just the number."
            yield self.task_cls(SumData(prompt=q, question=q, answer=a + b), self.config.task)
            i += 1


__all__ = ["SumTaskset"]
