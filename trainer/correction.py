"""`OffPolicyCorrection`: the per-token weight that corrects a token sampled by an older policy.

Three policies meet in an asynchronous step (trainer/policy_loss.py): the behaviour policy μ that
sampled token t (`old_logprobs`, from whichever weight version sampled that very token), the
proximal policy π_prox (the trainer's weights at the start of the step) and the current π_θ. The
clipped surrogate is taken against π_prox; each corrected token is weighted, without grad, by a
function of the behaviour ratio ρ_t = π_prox(y_t) / μ(y_t):

    tis  (truncated IS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy
          RL Training"; the truncated form PipelineRL uses):   w_t = min(ρ_t, C)
    mask (masked IS; AReaL's decoupled PPO with behav_imp_weight_cap, Fu et al. 2025, arXiv 2505.24298):
                                                              w_t = ρ_t if ρ_t <= C else 0

    ρ = 3, C = 2 -> tis 2.0, mask 0.0;   ρ = 0.5 -> 0.5 for both;   a token sampled by π_prox itself: ρ = 1, w = 1.

Registered like every loss (`@register_correction("name")`, `trainer.algo.policy_loss_args.correction`).
"""

from __future__ import annotations

import torch

from .masked import masked_mean


class OffPolicyCorrection:
    def __init__(self, cap: float):
        if not cap > 0:
            raise ValueError(f"the off-policy cap (policy_loss_args.tis_cap) must be > 0, got {cap}")
        self.cap = cap

    def weight(self, ratio: torch.Tensor) -> torch.Tensor:
        """Per-token weight (no grad) from the behaviour ratio π_prox / μ."""
        raise NotImplementedError

    def __call__(self, prox_logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                 mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Weights [B, T] (1 outside `mask`, the tokens corrected) and their metrics:
        `offpolicy/clip_frac` (corrected tokens whose ratio is beyond the cap: truncated or dropped) and
        `offpolicy/weight_mean` (mean weight over corrected tokens; 1 when there are none)."""
        m = mask.bool()
        # Zero the log-ratio outside the mask before exp: padding may hold anything.
        ratio = torch.exp(torch.where(m, prox_logprobs - old_logprobs, torch.zeros_like(old_logprobs))).detach()
        w = torch.where(m, self.weight(ratio), torch.ones_like(ratio))
        n = m.sum()
        return w, {"offpolicy/clip_frac": masked_mean((ratio > self.cap).float(), m),
                   "offpolicy/weight_mean": masked_mean(w, m) if n else torch.ones(())}
