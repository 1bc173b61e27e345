"""Clipped value loss for the PPO critic.

    v_clip = old_values + clamp(values - old_values, -clip, +clip)
    loss   = 0.5 * max((values - returns)^2, (v_clip - returns)^2)      (masked token mean)

values 2.0, old 0.0, returns 1.0, clip 0.5 -> max((2-1)^2, (0.5-1)^2) = 1 -> loss 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .masked import masked_mean
from .registry import get_value_loss, register_value_loss


@register_value_loss("clipped")
class ClippedValueLoss:
    @dataclass(kw_only=True)
    class Config:
        clip: float | None = 0.2
        """Half-width of the trust region around the values at generation time; None: plain MSE."""
        coef: float = 0.5
        """Multiplier of the squared error (0.5 makes the gradient the error)."""

    def __init__(self, config: "ClippedValueLoss.Config | None" = None):
        self.config = config if config is not None else self.Config()

    def __call__(self, *, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                 response_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        err = (values - returns) ** 2
        metrics = {}
        if c.clip is not None:
            v_clip = old_values + (values - old_values).clamp(-c.clip, c.clip)
            err_clip = (v_clip - returns) ** 2
            metrics["vf_clip_frac"] = float(masked_mean((err_clip > err).float(), response_mask))
            err = torch.maximum(err, err_clip)
        loss = c.coef * masked_mean(err, response_mask)
        metrics["value_loss"] = float(loss.detach())
        return loss, metrics


def build_value_loss(name: str = "clipped", **config) -> ClippedValueLoss:
    cls = get_value_loss(name)
    return cls(cls.Config(**config))
