"""GRPO loss: the clipped surrogate plus a KL penalty to a frozen reference policy (k3 estimator).

Per response token, with d = ref_logprobs - logprobs:

    kl_k3 = exp(d) - d - 1          (>= 0, unbiased for KL(π_θ || π_ref), low variance; Schulman)
    loss  = surrogate + kl_coef * kl_k3

d = log 0.5 (π_θ twice as likely as π_ref) -> kl_k3 = 0.5 - log 0.5 - 1 ≈ 0.193.
kl_coef = 0 needs no reference model (the trainer then builds none).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .masked import masked_mean
from .policy_loss import PolicyLoss
from .registry import register_policy_loss


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π || π_ref); 0 where `mask` is 0."""
    d = torch.where(mask.bool(), ref_logprobs - logprobs, torch.zeros_like(logprobs))
    return torch.exp(d) - d - 1.0


@register_policy_loss("grpo")
class GRPOLoss(PolicyLoss):
    @dataclass(kw_only=True)
    class Config(PolicyLoss.Config):
        kl_coef: float = 0.0
        """Weight of the k3 KL penalty to the reference policy; 0 disables it (and the ref model)."""

    @property
    def needs_ref(self) -> bool:
        return self.config.kl_coef > 0

    def __call__(self, *, logprobs, old_logprobs, advantages, response_mask, prox_logprobs=None,
                 ref_logprobs=None, entropy=None):
        pg, metrics = self.surrogate(logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages,
                                     response_mask=response_mask, prox_logprobs=prox_logprobs)
        if ref_logprobs is not None:
            kl = kl_k3(logprobs, ref_logprobs.detach(), response_mask)
            metrics["kl"] = masked_mean(kl.detach(), response_mask)
            if self.config.kl_coef:
                pg = pg + self.config.kl_coef * kl
        elif self.needs_ref:
            raise ValueError("GRPO with kl_coef > 0 needs ref_logprobs (a frozen reference model)")
        return self.finish(pg, response_mask, metrics, entropy)
