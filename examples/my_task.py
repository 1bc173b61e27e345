"""A task and a reward of your own, registered from your own module (docs/extending.md walks through it).

    cd examples      # or any directory holding this file
    python -m rlsync.train +recipe=grpo_standalone plugins=[my_task] task.name=sort \\
        hydra.run.dir=runs/sort

`plugins=[my_task]` makes the driver and every Ray worker import this module (from the directory the
run was started in) before they build anything, so the decorators below register `sort` and
`sorted_prefix` in each process's registries. Nothing in the installed package changes.

The task: sort 3 digits. Prompt `<bos> 3 1 2 <sep>`, answer `1 2 3 <eos>`. The reward gives partial
credit (from a random-init model an all-or-nothing reward is almost always 0: no GRPO signal).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsync.rollout.rewards import Prompt, register_reward
from rlsync.rollout.tasks import SymbolTask, register_task


@register_reward("sorted_prefix")
def sorted_prefix(prompt: Prompt, response_ids: list[int], response_text: str) -> float:
    """Share of the answer's tokens (digits, then <eos>) that the response has in the right place, in [0, 1].

    `prompt.answer` is what `prompt_at` put there (token ids here); `response_ids` are the sampled ids
    (up to the task's `response_len`), `response_text` their decoding (stops at <eos>).
    """
    target = prompt.answer
    return sum(i < len(response_ids) and response_ids[i] == t for i, t in enumerate(target)) / len(target)


@register_task("sort")
class SortTask(SymbolTask):
    """`<bos> x y z <sep>` -> the symbols sorted, then `<eos>`. `task.args` sets the Config's fields."""

    @dataclass(kw_only=True)
    class Config(SymbolTask.Config):
        symbols: str = "0123456789"
        """Alphabet: one token each; the vocab is these plus <pad> <bos> <eos> <sep>."""
        reward: str = "sorted_prefix"
        """The reward above, by its registered name."""

    def transform(self, xs: str) -> str:
        return "".join(sorted(xs))
