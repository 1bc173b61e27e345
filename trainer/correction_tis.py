"""Truncated importance sampling: w = min(π_prox/μ, C) (Yao et al. 2025; see trainer/correction.py).

    ratio 3.0, cap 2.0 -> 2.0;   ratio 0.5 -> 0.5
"""

from __future__ import annotations

import torch

from .correction import OffPolicyCorrection
from .registry import register_correction


@register_correction("tis")
class TruncatedIS(OffPolicyCorrection):
    def weight(self, ratio: torch.Tensor) -> torch.Tensor:
        return ratio.clamp(max=self.cap)
