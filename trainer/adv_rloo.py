"""RLOO advantage (REINFORCE leave-one-out): the baseline is the mean reward of the *other* answers.

    A_i = r_i - mean_{j != i} r_j  =  n/(n-1) * (r_i - mean(r_group))

rewards [1, 0, 0, 1] -> A = [2/3, -2/3, -2/3, 2/3]. A group of one keeps its raw reward (as verl).
This file is the proof that an estimator is one file: nothing else names it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .advantage import AdvantageEstimator, group_stats, sequence_rewards
from .registry import register_adv_est


@register_adv_est("rloo")
class RLOOAdvantage(AdvantageEstimator):
    @dataclass(kw_only=True)
    class Config(AdvantageEstimator.Config):
        pass

    needs_groups = True

    def __call__(self, *, rewards, response_mask, group_ids=None, values=None):
        r = sequence_rewards(rewards, response_mask)
        mean, _, n = group_stats(r, group_ids)
        adv = (r - mean) * n / (n - 1).clamp(min=1)
        adv = adv.where(n > 1, r)
        return adv.unsqueeze(-1) * response_mask.to(adv.dtype), None
