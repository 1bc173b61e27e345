"""Completions you can read: a few decoded samples per step, in `RUN_DIR/completions.jsonl` and a wandb table.

    c = Completion(prompt="<bos>abcd<sep>", response="dcba", reward=1.0, version=7, worker="main-0")
    picks = pick_samples(n_samples=16, group_size=4, k=3)    # [0, 4, 8]: one per prompt group first
    sample = CompletionSample(per_step=4)                   # the driver's side
    sample.add(result.completions)                          # each rollout call's few decoded samples
    rows = sample.take(trained_prompts(batches))            # of the prompts step 7 trained on
    logger.log_rows("completions", rows, step=7)            # -> completions.jsonl + wandb table

The rollout worker decodes only the samples it returns (`k` per call), so the driver receives a few
short strings per call, never the batch's text. A step's rows are completions of the prompts that
step trained on (their `version` says which weights produced them; with staleness k > 0 that can be
older than the step), one per prompt first; completions of prompts no step trains on (dropped as
too stale, lost with a worker) age out of a bounded pool. So every step that trained has rows, and
which rows does not depend on when calls happened to arrive (a `deterministic=true` run repeats them).

Simplifies: a response's whole text has one `version`; `version_spans` is the slot for engines that
switch weights mid-sequence (per-token version spans) and stays None until one reports them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

__all__ = ["Completion", "CompletionSample", "COMPLETION_COLUMNS", "pick_samples", "trained_prompts"]


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One sampled response as text, with what scored it; plain values (crosses Ray, lands in JSON)."""

    prompt: str
    """The prompt as the task's tokenizer decodes it."""
    response: str
    """The response as the task's tokenizer decodes it (what the reward read)."""
    reward: float
    """The task's reward for it."""
    version: int
    """The weight version that generated it."""
    worker: str = ""
    """The rollout worker (`pool-i`)."""
    prompt_index: int = -1
    """The prompt's index in the task's stream (its group)."""
    response_tokens: int = 0
    """Response length in tokens (including an end token)."""
    finished: bool = False
    """The response ended with the end token (False: cut at the length limit, or an engine's other stop)."""
    version_spans: list[tuple[int, int, int]] | None = None
    """(version, first token, end token) per span of the response when the engine switched weights
    mid-sequence; None: every token is `version`."""

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


COMPLETION_COLUMNS: tuple[str, ...] = ("step", *(f.name for f in dataclasses.fields(Completion)))
"""Columns of the completions table, in order (the JSONL rows and the wandb table share them)."""


def pick_samples(n_samples: int, group_size: int, k: int) -> list[int]:
    """Indices of `k` of `n_samples` samples laid out group after group: the first of each group, then
    the second of each, ... (many prompts before many answers to one prompt)."""
    g = max(1, group_size)
    order = sorted(range(n_samples), key=lambda i: (i % g, i // g))
    return order[:max(0, k)]


class CompletionSample:
    """The driver's bounded pool of decoded completions, by prompt, until a step that trained on the
    prompt takes up to `per_step` of them."""

    def __init__(self, per_step: int, pool: int | None = None) -> None:
        self.per_step = max(0, per_step)
        self.pool = pool if pool is not None else 16 * self.per_step
        """At most this many completions wait (the oldest prompts' go first)."""
        self._held: dict[int, list[Completion]] = {}  # prompt index -> its completions, prompts oldest first
        self._n = 0

    def add(self, completions: Sequence[Completion]) -> None:
        if not self.per_step:
            return
        for c in completions:
            self._held.setdefault(c.prompt_index, []).append(c)
            self._n += 1
        while self._n > self.pool:  # prompts never trained on (dropped, lost) age out
            self._n -= len(self._held.pop(next(iter(self._held))))

    def take(self, prompts: Iterable[int]) -> list[dict[str, Any]]:
        """Up to `per_step` completions of `prompts` (the step's trained prompt indices), one per prompt
        first, as rows (without `step`: the logger adds it); every completion of those prompts leaves."""
        per_prompt = [self._held.pop(p) for p in dict.fromkeys(prompts) if p in self._held]
        self._n -= sum(map(len, per_prompt))
        rows: list[dict[str, Any]] = []
        for i in range(max(map(len, per_prompt), default=0)):
            rows += [cs[i].row() for cs in per_prompt if i < len(cs)]
        return rows[:self.per_step]


def trained_prompts(batches: Iterable[Any]) -> list[int]:
    """The prompt index of each trained group (a group's `group_ids` are its prompt's index)."""
    return [int(b.group_ids[0]) for b in batches if b.group_ids is not None and len(b.group_ids)]
