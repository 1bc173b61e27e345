"""GRPO advantage: each sample's reward relative to the other answers to the same prompt.

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)       (norm_by_std=True, the GRPO paper)
    A_i =  r_i - mean(r_group)                               (norm_by_std=False, Dr. GRPO)

rewards [1, 0, 0, 1] in one group -> mean 0.5, std 0.577 -> A ≈ [0.866, -0.866, -0.866, 0.866],
broadcast to every response token. A group where all rewards agree gives A = 0 (no signal).
"""

from __future__ import annotations

from dataclasses import dataclass


from .advantage import AdvantageEstimator, group_stats, sequence_rewards
from .registry import register_adv_est


@register_adv_est("grpo")
class GRPOAdvantage(AdvantageEstimator):
    @dataclass(kw_only=True)
    class Config(AdvantageEstimator.Config):
        norm_by_std: bool = True
        """Divide by the group's reward std; False keeps the raw centred reward (Dr. GRPO)."""
        eps: float = 1e-6
        """Added to the std so a group of equal rewards divides by eps, not 0."""

    needs_groups = True

    def __call__(self, *, rewards, response_mask, group_ids=None, values=None):
        r = sequence_rewards(rewards, response_mask)
        mean, std, _ = group_stats(r, group_ids)
        adv = r - mean
        if self.config.norm_by_std:
            adv = adv / (std + self.config.eps)
        return adv.unsqueeze(-1) * response_mask.to(adv.dtype), None
