"""`AdvantageEstimator`: the base of every estimator, and the group statistics GRPO and RLOO share.

An estimator maps rewards (and, for GAE, critic values) to per-token advantages [B, T] (zero where
`response_mask` is 0) and, when it has them, critic returns:

    est = build_adv_est("grpo", norm_by_std=False)
    adv, returns = est(rewards=r, response_mask=m, group_ids=g)    # returns is None for GRPO

Simplifies: sequence-level estimators broadcast one number to every response token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .registry import get_adv_est


class AdvantageEstimator:
    @dataclass(kw_only=True)
    class Config:
        pass

    needs_values: ClassVar[bool] = False
    """True when the estimator reads critic values (the trainer then needs a critic)."""
    needs_groups: ClassVar[bool] = False
    """True when the estimator reads `group_ids` (samples that answered the same prompt)."""

    def __init__(self, config: "AdvantageEstimator.Config | None" = None):
        self.config = config if config is not None else self.Config()

    def __call__(
        self,
        *,
        rewards: torch.Tensor,
        response_mask: torch.Tensor,
        group_ids: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        raise NotImplementedError


def build_adv_est(name: str, **config: Any) -> AdvantageEstimator:
    """The registered estimator `name`, configured with `config` (its `Config` fields)."""
    cls = get_adv_est(name)
    return cls(cls.Config(**config))


def sequence_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] rewards: as given, or per-token rewards [B, T] summed over the response."""
    if rewards.dim() == 1:
        return rewards.float()
    return (rewards * response_mask).sum(-1).float()


def group_stats(x: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample (group mean, group unbiased std, group size) of `x` [B] over samples sharing a group id.

    A group of one has std 1 (so normalising by it is a no-op rather than a division by nan).
    """
    if group_ids is None:
        raise ValueError("this advantage estimator needs Batch.group_ids (which samples share a prompt)")
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1
    count = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, inv, torch.ones_like(x))
    mean = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, inv, x) / count
    sq = torch.zeros(n_groups, dtype=x.dtype).index_add_(0, inv, (x - mean[inv]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.ones_like(sq))
    return mean[inv], std[inv], count[inv]
