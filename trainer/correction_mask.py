"""Masked importance sampling: w = π_prox/μ, or 0 for a token whose ratio is beyond C (AReaL's decoupled
PPO cap; see trainer/correction.py). The token then adds nothing to the loss but still counts in its mean.

    ratio 3.0, cap 2.0 -> 0.0 (dropped);   ratio 0.5 -> 0.5
"""

from __future__ import annotations

import torch

from .correction import OffPolicyCorrection
from .registry import register_correction


@register_correction("mask")
class MaskedIS(OffPolicyCorrection):
    def weight(self, ratio: torch.Tensor) -> torch.Tensor:
        return torch.where(ratio <= self.cap, ratio, torch.zeros_like(ratio))
