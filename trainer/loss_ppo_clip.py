"""PPO clipped surrogate, token level, mask-aware mean (see `policy_loss.PolicyLoss.surrogate`).

    ratio 1.5, A = +1, clip_eps 0.2 -> per-token loss -min(1.5, 1.2) = -1.2 (clipped)
    ratio 0.5, A = +1               -> -min(0.5, 0.8)  = -0.5 (unclipped: pessimistic side)
"""

from __future__ import annotations

from dataclasses import dataclass

from .policy_loss import PolicyLoss
from .registry import register_policy_loss


@register_policy_loss("ppo_clip")
class PPOClipLoss(PolicyLoss):
    @dataclass(kw_only=True)
    class Config(PolicyLoss.Config):
        pass

    def __call__(self, *, logprobs, old_logprobs, advantages, response_mask, prox_logprobs=None,
                 ref_logprobs=None, entropy=None):
        pg, metrics = self.surrogate(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
                                     response_mask=response_mask, prox_logprobs=prox_logprobs)
        return self.finish(pg, response_mask, metrics, entropy)
