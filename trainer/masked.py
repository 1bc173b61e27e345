"""Mask-aware reductions over token tensors shaped [batch, seq].

Every loss and estimator averages only over response tokens (mask 1); prompt and padding tokens
(mask 0) must change nothing, whatever garbage they hold:

    masked_mean(torch.tensor([[1., 9.]]), torch.tensor([[1, 0]]))  # -> 1.0
"""

from __future__ import annotations

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` where `mask` is 1. Masked positions may hold inf/nan: they are zeroed, not multiplied."""
    kept = torch.where(mask.bool(), x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is 1 (0 when the mask is empty)."""
    count = mask.to(x.dtype).sum() if dim is None else mask.to(x.dtype).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the masked positions; masked-out positions come back as 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return torch.where(mask.bool(), (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


def aggregate_tokens(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    `token_mean`: every response token in the batch weighs the same (DAPO, Dr. GRPO).
    `seq_mean_token_mean`: mean per sequence, then mean over sequences (the original GRPO paper).
    """
    if mode == "token_mean":
        return masked_mean(loss, mask)
    if mode == "seq_mean_token_mean":
        return masked_mean(loss, mask, dim=-1).mean()
    raise ValueError(f"unknown loss aggregation {mode!r}; known: token_mean, seq_mean_token_mean")
