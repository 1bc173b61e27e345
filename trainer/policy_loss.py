"""`PolicyLoss`: the base of every policy loss, and the clipped, off-policy-corrected surrogate they share.

Three policies meet in an asynchronous step: the behaviour policy that sampled the tokens
(`old_logprobs`, from the rollout, possibly several versions stale), the proximal policy (the
trainer's weights at the start of this step, `prox_logprobs`, computed without grad), and the
current policy being optimised (`logprobs`). Per token, with A the advantage:

    anchor = prox_logprobs if given, else old_logprobs
    ratio  = exp(logprobs - anchor)
    pg     = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    pg    *= min(exp(prox - old), tis_cap)        # truncated importance sampling, if tis_cap is set

The clip keeps each update close to the anchor; the truncated IS weight (no grad) corrects for
stale samples without letting one token's weight explode (decoupled PPO / verl's TIS).
Without `prox_logprobs` (tis_cap None) the clip is taken against the behaviour policy directly,
which is standard PPO and, for k = 0 staleness, the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .masked import aggregate_tokens, masked_mean
from .registry import get_policy_loss


class PolicyLoss:
    @dataclass(kw_only=True)
    class Config:
        clip_eps: float = 0.2
        """Lower clip on the ratio: ratio >= 1 - clip_eps."""
        clip_eps_high: float | None = None
        """Upper clip: ratio <= 1 + clip_eps_high; None uses clip_eps (symmetric). DAPO uses 0.28."""
        tis_cap: float | None = None
        """Truncated importance sampling cap on π_prox/π_behaviour for stale samples; None turns the
        correction off. When set, the trainer computes `prox_logprobs` before updating."""
        entropy_coef: float = 0.0
        """Weight of an entropy bonus (subtracted from the loss)."""
        loss_agg: str = "token_mean"
        """How per-token losses become a scalar: token_mean or seq_mean_token_mean."""

    def __init__(self, config: "PolicyLoss.Config | None" = None):
        self.config = config if config is not None else self.Config()

    @property
    def needs_ref(self) -> bool:
        """True when the loss reads a frozen reference policy's log-probs (`ref_logprobs`)."""
        return False

    @property
    def needs_prox(self) -> bool:
        """True when the trainer must compute proximal log-probs before the update."""
        return self.config.tis_cap is not None

    def __call__(
        self,
        *,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        prox_logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss (with grad) and detached float metrics."""
        raise NotImplementedError

    def surrogate(self, *, logprobs, old_logprobs, advantages, response_mask, prox_logprobs=None):
        """Per-token clipped, IS-corrected policy-gradient loss [B, T] and its metrics."""
        c = self.config
        m = response_mask.bool()
        zero = torch.zeros_like(logprobs)
        if c.tis_cap is not None and prox_logprobs is None:
            raise ValueError("tis_cap is set: pass prox_logprobs (the trainer's log-probs before this update)")
        anchor = prox_logprobs if prox_logprobs is not None else old_logprobs
        # Zero masked positions before exp: exp(garbage) = inf would turn into nan gradients.
        log_ratio = torch.where(m, logprobs - anchor.detach(), zero)
        ratio = torch.exp(log_ratio)
        hi = c.clip_eps if c.clip_eps_high is None else c.clip_eps_high
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1.0 - c.clip_eps, 1.0 + hi) * advantages
        pg = -torch.minimum(surr1, surr2)
        metrics = {
            "clip_frac": masked_mean((surr2 < surr1).float(), m),
            "approx_kl": masked_mean(0.5 * log_ratio.detach() ** 2, m),
            "ratio_mean": masked_mean(ratio.detach(), m),
        }
        if c.tis_cap is not None:
            is_log = torch.where(m, prox_logprobs - old_logprobs, zero).detach()
            w = torch.exp(is_log)
            metrics["tis_truncated_frac"] = masked_mean((w > c.tis_cap).float(), m)
            w = w.clamp(max=c.tis_cap)
            metrics["tis_weight_mean"] = masked_mean(w, m)
            pg = pg * w
        return pg, metrics

    def finish(self, per_token: torch.Tensor, response_mask: torch.Tensor, metrics: dict[str, Any],
               entropy: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
        """Aggregate, add the entropy bonus, and turn metrics into floats."""
        loss = aggregate_tokens(per_token, response_mask, self.config.loss_agg)
        if entropy is not None:
            ent = masked_mean(entropy, response_mask)
            metrics["entropy"] = ent
            if self.config.entropy_coef:
                loss = loss - self.config.entropy_coef * ent
        metrics["policy_loss"] = loss
        return loss, {k: float(v.detach()) if torch.is_tensor(v) else float(v) for k, v in metrics.items()}


def build_policy_loss(name: str, **config: Any) -> PolicyLoss:
    """The registered policy loss `name`, configured with `config` (its `Config` fields)."""
    cls = get_policy_loss(name)
    return cls(cls.Config(**config))
