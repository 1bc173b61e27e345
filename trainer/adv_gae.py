"""GAE advantage for PPO: token-level, bootstrapped from the critic's values.

Over the response tokens of each row (masked positions are skipped, not treated as steps):

    delta_t = r_t + gamma * V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * A_{t+1}           (A and V are 0 after the last token)
    R_t     = A_t + V_t                                  (the critic's regression target)

A sequence reward [B] is placed on the last response token. With gamma = lam = 1 and V = 0 every
token's advantage is the final reward. Advantages are then whitened over the batch (optional).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantage import AdvantageEstimator
from .masked import masked_whiten
from .registry import register_adv_est


def token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] per-token rewards: as given, or a sequence reward put on each row's last response token."""
    if rewards.dim() == 2:
        return rewards.float() * response_mask
    t = response_mask.shape[1]
    last = (response_mask.long() * torch.arange(t)).argmax(-1)
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    out[torch.arange(len(rewards)), last] = rewards.float()
    return out * response_mask


@register_adv_est("gae")
class GAEAdvantage(AdvantageEstimator):
    @dataclass(kw_only=True)
    class Config(AdvantageEstimator.Config):
        gamma: float = 1.0
        """Discount per token."""
        lam: float = 0.95
        """GAE lambda: 0 is one-step TD (low variance, biased), 1 is Monte Carlo."""
        whiten: bool = True
        """Normalise advantages to mean 0, std 1 over the batch's response tokens."""

    needs_values = True

    def __call__(self, *, rewards, response_mask, group_ids=None, values=None):
        if values is None:
            raise ValueError("GAE needs critic values (Batch.values or a trainer with a critic)")
        g, lam = self.config.gamma, self.config.lam
        m = response_mask.float()
        r = token_rewards(rewards, response_mask)
        v = values.float() * m
        b, t = m.shape
        adv = torch.zeros(b, t)
        next_v = torch.zeros(b)
        last = torch.zeros(b)
        for i in reversed(range(t)):
            delta = r[:, i] + g * next_v - v[:, i]
            a = delta + g * lam * last
            # Masked positions carry the running values through unchanged.
            next_v = torch.where(m[:, i] > 0, v[:, i], next_v)
            last = torch.where(m[:, i] > 0, a, last)
            adv[:, i] = a * m[:, i]
        returns = (adv + v) * m
        if self.config.whiten:
            adv = masked_whiten(adv, response_mask)
        return adv, returns
