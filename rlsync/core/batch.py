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
    versions        [B] long      oldest policy version that sampled any of the sample's response tokens
                                  (the staleness bound and the drop cap read it)
    token_versions  [B, T] long   optional: the version that sampled each response token (engines that take
                                  a new version mid-generation); None = every token from `versions`
    group_ids       [B] long      samples with one id answered the same prompt (GRPO/RLOO groups)

A sample's version spans are `version_spans(...)` over its response tokens, counted from its first
response token, last index inclusive: tokens 0-5 sampled by v3 and 6-9 by v4 give [(3, 0, 5), (4, 6, 9)].

Simplifies: one flat dataclass of tensors (no TensorDict); `select` and `split` give mini-batches.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


class BatchError(ValueError):
    """A batch whose tensors disagree in shape or miss what the step needs."""


_TOKEN_FIELDS = ("attention_mask", "response_mask", "old_logprobs", "advantages", "values", "returns",
                 "token_versions")
"""Fields shaped [B, T] like input_ids."""


def version_spans(token_versions: torch.Tensor, response_mask: torch.Tensor) -> list[tuple[int, int, int]]:
    """Ordered (version, first, last) runs of one sample's response tokens; indices count response tokens
    from 0, `last` inclusive; a new span starts wherever the version changes.

        version_spans(torch.tensor([9, 3, 3, 4]), torch.tensor([0, 1, 1, 1]))   # [(3, 0, 1), (4, 2, 2)]
        version_spans(torch.tensor([9, 9]), torch.tensor([0, 0]))               # [] (no response)
    """
    vs = token_versions[response_mask.bool()].tolist()
    spans: list[tuple[int, int, int]] = []
    for j, v in enumerate(vs):
        if spans and spans[-1][0] == v:
            spans[-1] = (v, spans[-1][1], j)
        else:
            spans.append((v, j, j))
    return spans


def span_counts(token_versions: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] long: `len(version_spans(...))` of every row at once (response tokens are one run per row)."""
    m = response_mask.bool()
    changes = (token_versions[:, 1:] != token_versions[:, :-1]) & m[:, 1:] & m[:, :-1]
    return m.any(-1).long() + changes.long().sum(-1)


def oldest_versions(token_versions: torch.Tensor, response_mask: torch.Tensor, default: torch.Tensor) -> torch.Tensor:
    """[B] long: the oldest version among each row's response tokens; `default` for a row without any."""
    m = response_mask.bool()
    big = torch.iinfo(torch.long).max
    oldest = torch.where(m, token_versions.long(), torch.full_like(token_versions, big, dtype=torch.long)).amin(-1)
    return torch.where(m.any(-1), oldest, default.long())


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
    """[B] oldest version that sampled any of the sample's response tokens (= its version when one sampled all)."""
    group_ids: torch.Tensor | None = None
    """[B] prompt group of each sample; required by group estimators (grpo, rloo)."""
    advantages: torch.Tensor | None = None
    """[B, T] advantages; computed by the trainer's estimator when None."""
    values: torch.Tensor | None = None
    """[B, T] critic values at generation time (PPO); computed by the trainer when None."""
    returns: torch.Tensor | None = None
    """[B, T] critic regression targets (PPO); computed with the advantages when None."""
    token_versions: torch.Tensor | None = None
    """[B, T] long: the version that sampled each response token; None = every token from `versions`."""

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
            if f.name in _TOKEN_FIELDS:
                if tuple(v.shape) != (b, t):
                    raise BatchError(f"Batch.{f.name} has shape {tuple(v.shape)}, expected {(b, t)}")
        if self.rewards.dim() not in (1, 2) or (self.rewards.dim() == 2 and self.rewards.shape[1] != t):
            raise BatchError(f"Batch.rewards must be [B] or [B, T]; got {tuple(self.rewards.shape)}")
        if self.token_versions is not None:
            self._validate_token_versions()

    def _validate_token_versions(self) -> None:
        if self.token_versions.dtype != torch.long:
            raise BatchError(f"Batch.token_versions must be long (integer versions), got {self.token_versions.dtype}")
        resp = self.response_mask.bool()
        oldest = oldest_versions(self.token_versions, resp, self.versions)
        if not torch.equal(oldest, self.versions.to(oldest.dtype)):
            i = int((oldest != self.versions).nonzero()[0, 0])
            raise BatchError(f"Batch.versions[{i}]={int(self.versions[i])} is not the oldest of its response tokens' "
                             f"versions ({int(oldest[i])}): set versions to the oldest token version")

    def versions_per_token(self) -> torch.Tensor:
        """[B, T] long: the version that sampled each token (`token_versions`, else each sample's version)."""
        if self.token_versions is not None:
            return self.token_versions
        return self.versions.view(-1, 1).expand_as(self.input_ids).long()

    def span_counts(self) -> torch.Tensor:
        """[B] long: version spans over each sample's response tokens (0 for an empty response)."""
        return span_counts(self.versions_per_token(), self.response_mask)

    def spans(self, i: int) -> list[tuple[int, int, int]]:
        """Sample `i`'s ordered (version, first token, last token) over its response tokens."""
        return version_spans(self.versions_per_token()[i], self.response_mask[i])

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
            if f.name == "token_versions" and any(v is not None for v in vals):
                vals = [b.versions_per_token() for b in batches]  # a batch without them: all from `versions`
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
