"""Completions you can read: a few decoded samples per step, in `RUN_DIR/completions.jsonl` and a wandb table.

    c = Completion(prompt="<bos>abcd<sep>", response="dcba", reward=1.0, version=7, worker="main-0")
    picks = pick_samples(n_samples=16, group_size=4, k=3)    # [0, 4, 8]: one per prompt group first
    sample = CompletionSample(per_step=4)                   # the driver's side
    sample.add(result.completions)                          # each rollout call's few decoded samples
    logger.log_rows("completions", sample.take(), step=7)   # -> completions.jsonl + wandb table

The rollout worker decodes only the samples it returns (`k` per call), so the driver receives a few
short strings per call, never the batch's text. A step's rows are the completions that *arrived*
during that step (their `version` says which weights produced them; with staleness k > 0 that can
be older than the step). The driver keeps the first `per_step` of them.

Simplifies: a response's whole text has one `version`; `version_spans` is the slot for engines that
switch weights mid-sequence (per-token version spans) and stays None until one reports them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["Completion", "CompletionSample", "COMPLETION_COLUMNS", "pick_samples"]


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
    """The driver's bounded sample: at most `per_step` completions held until `take()`."""

    def __init__(self, per_step: int) -> None:
        self.per_step = max(0, per_step)
        self._held: list[Completion] = []

    def add(self, completions: Sequence[Completion]) -> None:
        room = self.per_step - len(self._held)
        if room > 0:
            self._held.extend(completions[:room])

    def take(self) -> list[dict[str, Any]]:
        """The held completions as rows (without `step`: the logger adds it), and empty the sample."""
        rows = [c.row() for c in self._held]
        self._held = []
        return rows
