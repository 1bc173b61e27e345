"""`Batch`: the tensors one trainer step consumes, all token tensors aligned to `input_ids`.

Layout (B samples, T tokens; a sample is prompt then response, left-padded prompts are fine):

    input_ids       [B, T] long   prompt + response tokens
    attention_mask  [B, T]        1 on real tokens (prompt and response), 0 on padding
    response_mask   [B, T]        1 on the response tokens the policy is trained on
    old_logprobs    [B, T] float  behaviour log-prob of input_ids[:, t] given the tokens before it, as
                                  computed by the rollout engine that sampled it (0 where masked)
    rewards         [B] or [B, T] sequence reward, or per-token rewards
    advantages      [B, T]        optional: the trainer computes them when absent
    values, returns [B, T]        optional: PPO critic targets (the trainer fills values when absent)
    versions        [B] long      policy version that generated each sample (staleness accounting)
    group_ids       [B] long      samples with one id answered the same prompt (GRPO/RLOO groups)

Simplifies: one flat dataclass of tensors (no TensorDict); `select` and `split` give mini-batches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


class BatchError(ValueError):
    """A batch whose tensors disagree in shape or miss what the step needs."""


@dataclass(kw_only=True)
class Batch:
    input_ids: torch.Tensor
    """[B, T] prompt + response token ids."""
    attention_mask: torch.Tensor
    """[B, T] 1 on real tokens, 0 on padding."""
    response_mask: torch.Tensor
    """[B, T] 1 on the response tokens the loss is computed on."""
    old_logprobs: torch.Tensor
    """[B, T] behaviour log-probs from the rollout, aligned to `input_ids`."""
    rewards: torch.Tensor
    """[B] sequence rewards, or [B, T] per-token rewards."""
    versions: torch.Tensor
    """[B] policy version that generated each sample."""
    group_ids: torch.Tensor | None = None
    """[B] prompt group of each sample; required by group estimators (grpo, rloo)."""
    advantages: torch.Tensor | None = None
    """[B, T] advantages; computed by the trainer's estimator when None."""
    values: torch.Tensor | None = None
    """[B, T] critic values at generation time (PPO); computed by the trainer when None."""
    returns: torch.Tensor | None = None
    """[B, T] critic regression targets (PPO); computed with the advantages when None."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        b, t = self.input_ids.shape
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if not isinstance(v, torch.Tensor):
                raise BatchError(f"Batch.{f.name} must be a tensor, got {type(v).__name__}")
            if v.shape[0] != b:
                raise BatchError(f"Batch.{f.name} has {v.shape[0]} rows, input_ids has {b}")
            if f.name in ("attention_mask", "response_mask", "old_logprobs", "advantages", "values", "returns"):
                if tuple(v.shape) != (b, t):
                    raise BatchError(f"Batch.{f.name} has shape {tuple(v.shape)}, expected {(b, t)}")
        if self.rewards.dim() not in (1, 2) or (self.rewards.dim() == 2 and self.rewards.shape[1] != t):
            raise BatchError(f"Batch.rewards must be [B] or [B, T]; got {tuple(self.rewards.shape)}")

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def replace(self, **changes: torch.Tensor | None) -> "Batch":
        return dataclasses.replace(self, **changes)

    def select(self, index: torch.Tensor) -> "Batch":
        """The samples at `index` (a long tensor of rows)."""
        return self.replace(**{f.name: (v[index] if (v := getattr(self, f.name)) is not None else None)
                               for f in dataclasses.fields(self)})

    def split(self, n: int) -> list["Batch"]:
        """`n` mini-batches of consecutive rows (sizes differ by at most one)."""
        if not 1 <= n <= len(self):
            raise BatchError(f"cannot split a batch of {len(self)} into {n} mini-batches")
        return [self.select(idx) for idx in torch.arange(len(self)).tensor_split(n)]

    def to(self, device: torch.device | str) -> "Batch":
        return self.replace(**{f.name: (v.to(device) if (v := getattr(self, f.name)) is not None else None)
                               for f in dataclasses.fields(self)})

    @staticmethod
    def concat(batches: list["Batch"], pad_id: int = 0) -> "Batch":
        """Stack batches, right-padding token tensors to the longest T (padding is masked out)."""
        if not batches:
            raise BatchError("cannot concatenate zero batches")
        t = max(b.input_ids.shape[1] for b in batches)
        out = {}
        for f in dataclasses.fields(Batch):
            vals = [getattr(b, f.name) for b in batches]
            if any(v is None for v in vals):
                if not all(v is None for v in vals):
                    raise BatchError(f"Batch.{f.name} is set in some batches and not in others")
                out[f.name] = None
                continue
            fill = pad_id if f.name == "input_ids" else 0
            out[f.name] = torch.cat([
                torch.nn.functional.pad(v, (0, t - v.shape[1]), value=fill) if v.dim() == 2 else v
                for v in vals
            ])
        return Batch(**out)
