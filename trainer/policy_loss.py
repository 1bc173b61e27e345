"""`PolicyLoss`: the base of every policy loss, and the clipped, off-policy-corrected surrogate they share.

Three policies meet in an asynchronous step: the behaviour policy μ that sampled each token
(`old_logprobs`, from the rollout: the version that sampled that token, possibly several versions
stale, and a sample may mix versions), the proximal policy (the trainer's weights at the start of
this step, `prox_logprobs`, computed without grad), and the current policy being optimised
(`logprobs`). Per response token t, with A the advantage:

    anchor = prox_logprobs if given, else old_logprobs
    ratio  = exp(logprobs - anchor)
    pg     = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    pg    *= w_t(prox / old)        # the off-policy correction (trainer/correction.py), no grad:
                                    # tis: min(ρ, C);  mask: ρ if ρ <= C else 0;  ρ = exp(prox - old)

That is decoupled PPO (Hilton et al. 2022; AReaL) with truncated importance sampling on the behaviour
ratio (Yao et al. 2025). The trainer passes `prox_logprobs` only when the batch has tokens to correct
(`correct=mixed`, the default: the older-version tokens of samples that span a weight switch;
`stale`: every older-version token); for the other tokens it passes the behaviour log-prob itself
(ρ = 1), so they are plain PPO clipped against μ, and a batch without such tokens costs no extra forward.
Without `prox_logprobs` the clip is against the behaviour policy directly (standard PPO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .correction import OffPolicyCorrection
from .masked import aggregate_tokens, masked_mean
from .registry import get_correction, get_policy_loss


class PolicyLoss:
    @dataclass(kw_only=True)
    class Config:
        clip_eps: float = 0.2
        """Lower clip on the ratio: ratio >= 1 - clip_eps."""
        clip_eps_high: float | None = None
        """Upper clip: ratio <= 1 + clip_eps_high; None uses clip_eps (symmetric). DAPO uses 0.28."""
        correction: str = "tis"
        """Off-policy correction of tokens sampled by an older version (registry `trainer.registry.CORRECTIONS`):
        `tis` weighs each by min(π_prox/μ, tis_cap), `mask` drops those beyond tis_cap (weight 0; AReaL), `none`."""
        tis_cap: float | None = 2.0
        """C, the cap on the per-token ratio π_prox/μ; None turns the correction off
        (as `correction=none`)."""
        correct: str = "mixed"
        """Tokens corrected: `mixed` (the older-version tokens of samples that span a weight switch), `stale`
        (every token sampled by a version older than the trainer's, also of single-version stale samples) or
        `all` (every token, also the engine-vs-trainer numerics gap: the pre-issue-32 `tis_cap`). Uncorrected
        tokens are clipped against their behaviour log-prob (docs/rl.md: why `mixed` is the default)."""
        entropy_coef: float = 0.0
        """Weight of an entropy bonus (subtracted from the loss)."""
        loss_agg: str = "token_mean"
        """How per-token losses become a scalar: token_mean or seq_mean_token_mean."""

    def __init__(self, config: "PolicyLoss.Config | None" = None):
        self.config = c = config if config is not None else self.Config()
        if c.correct not in ("mixed", "stale", "all"):
            raise ValueError(f"policy_loss_args.correct={c.correct!r}: must be mixed, stale or all")
        self.correction: OffPolicyCorrection | None = (
            None if c.correction == "none" or c.tis_cap is None else get_correction(c.correction)(c.tis_cap))

    @property
    def needs_ref(self) -> bool:
        """True when the loss reads a frozen reference policy's log-probs (`ref_logprobs`)."""
        return False

    @property
    def needs_prox(self) -> bool:
        """True when the loss corrects off-policy tokens: the trainer computes proximal log-probs for a
        batch that has any (`corrected_tokens`)."""
        return self.correction is not None

    def corrected_tokens(self, response_mask: torch.Tensor, stale: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """[B, T] bool: the tokens the correction weighs, given `stale` [B, T] (sampled by an older version
        than the trainer's) and `mixed` [B] (the sample spans more than one version)."""
        m = response_mask.bool()
        if self.correction is None:
            return torch.zeros_like(m)
        if self.config.correct == "all":
            return m
        older = m & stale.bool()
        return older if self.config.correct == "stale" else older & mixed.bool().view(-1, 1)

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
        if self.correction is not None and prox_logprobs is not None:
            # Tokens the trainer did not mark carry prox == old: ρ = 1, weight 1 (tis and mask alike).
            w, _ = self.correction(prox_logprobs.detach(), old_logprobs, m)
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
