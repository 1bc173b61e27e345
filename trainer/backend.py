"""`TrainerBackend`: one RL update step, whatever holds the weights (plain torch, DeepSpeed ZeRO).

The step is the same on every backend; only "run backward and step the optimizer", checkpointing
and handing out the weights differ, and those are the abstract methods:

    backend = TorchBackend(TorchBackend.Config(), model)
    metrics = backend.train_step(batch)   # {"loss": ..., "kl": ..., "entropy": ..., "clip_frac": ..., "grad_norm": ...}
    backend.version                        # number of steps taken = the version its weights are
    backend.named_parameters_for_sync()   # name -> tensor the hub publishes as `version`

One `train_step`: (no grad) reference log-probs if the loss has a KL term, proximal log-probs if it
corrects tokens of the batch sampled by older versions (per token, `Batch.versions_per_token()`),
critic values and advantages if the batch has none; then `ppo_epochs` × `num_mini_batches` optimizer
steps of the policy (and the critic, for PPO).

Simplifies: the whole batch fits in memory at once (no micro-batch gradient accumulation).
"""

from __future__ import annotations

import copy
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .advantage import AdvantageEstimator, build_adv_est, group_stats, sequence_rewards
from rlsync.core.batch import Batch, BatchError
from .critic import ValueModel
from rlsync.core.logprobs import critic_values, response_start, token_logprobs
from .loss_value import build_value_loss
from .masked import masked_mean
from .policy_loss import PolicyLoss, build_policy_loss

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class OptimizerConfig:
    lr: float = 1e-3
    """AdamW learning rate."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.999
    """AdamW second-moment decay."""
    eps: float = 1e-8
    """AdamW denominator epsilon."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""

    def build(self, params) -> torch.optim.AdamW:
        return torch.optim.AdamW(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps,
                                 weight_decay=self.weight_decay)


class TrainerBackend:
    @dataclass(kw_only=True)
    class Config:
        optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
        """Policy optimizer."""
        critic_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
        """Critic optimizer (PPO only)."""
        grad_clip: float | None = 1.0
        """Max global grad norm (policy and critic each); None disables clipping (the norm is still logged)."""
        adv_est: str = "grpo"
        """Registered advantage estimator (grpo, gae, rloo, ...)."""
        adv_est_args: dict[str, Any] = field(default_factory=dict)
        """Fields of the estimator's Config, e.g. {"norm_by_std": false}."""
        policy_loss: str = "grpo"
        """Registered policy loss (grpo, ppo_clip, ...)."""
        policy_loss_args: dict[str, Any] = field(default_factory=dict)
        """Fields of the loss's Config, e.g. {"clip_eps": 0.2, "kl_coef": 0.01, "tis_cap": 2.0}."""
        value_loss_args: dict[str, Any] = field(default_factory=dict)
        """Fields of the clipped value loss's Config (PPO only)."""
        ppo_epochs: int = 1
        """Passes over each batch."""
        num_mini_batches: int = 1
        """Optimizer steps per pass (the batch is split into this many mini-batches)."""
        temperature: float = 1.0
        """Sampling temperature of the rollout; log-probs are of the temperature-scaled policy."""

    def __init__(self, config: "TrainerBackend.Config", model: torch.nn.Module, *,
                 critic: torch.nn.Module | None = None, ref_model: torch.nn.Module | None = None):
        self.config = config
        self.adv_est: AdvantageEstimator = build_adv_est(config.adv_est, **config.adv_est_args)
        self.policy_loss: PolicyLoss = build_policy_loss(config.policy_loss, **config.policy_loss_args)
        self.value_loss = build_value_loss(**config.value_loss_args) if self.adv_est.needs_values else None
        # Build what the algorithm needs and the caller did not give: a frozen copy of the initial
        # policy as reference, a critic initialised from the policy's backbone.
        if self.policy_loss.needs_ref and ref_model is None:
            ref_model = copy.deepcopy(model)
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
        if self.adv_est.needs_values and critic is None:
            critic = ValueModel.from_causal_lm(model)
        self.ref_model = ref_model
        self.version = 0
        """Optimizer steps taken: the version of the weights this backend holds."""
        self._setup(model, critic)

    # ---- what each backend provides -----------------------------------------------------------
    def _setup(self, model: torch.nn.Module, critic: torch.nn.Module | None) -> None:
        """Wrap the model (and critic) and build optimizers."""
        raise NotImplementedError

    @property
    def policy(self) -> torch.nn.Module:
        """The module to call forward on (wrapped: DDP or a DeepSpeed engine)."""
        raise NotImplementedError

    @property
    def critic(self) -> torch.nn.Module | None:
        raise NotImplementedError

    def _step_policy(self, loss: torch.Tensor) -> float:
        """backward, clip, optimizer step, zero grad; returns the pre-clip global grad norm."""
        raise NotImplementedError

    def _step_critic(self, loss: torch.Tensor) -> float:
        raise NotImplementedError

    def named_parameters_for_sync(self) -> dict[str, torch.Tensor]:
        """name -> full policy tensor, names as the bare HF model's `named_parameters()`."""
        raise NotImplementedError

    # ---- the step, shared -----------------------------------------------------------------------
    @torch.no_grad()
    def prepare(self, batch: Batch) -> tuple[Batch, dict[str, torch.Tensor]]:
        """No-grad passes: fills values/advantages/returns; returns (batch, extra): extra holds "ref" and "prox"
        log-probs when needed, and the batch's `offpolicy/*` metrics (scalars)."""
        extra: dict[str, torch.Tensor] = {}
        temp = self.config.temperature
        start = response_start(batch.response_mask)  # the prompt's positions get no logits (every use is masked)
        if self.ref_model is not None and self.policy_loss.needs_ref:
            extra["ref"], _ = token_logprobs(self.ref_model, batch.input_ids, batch.attention_mask, temperature=temp,
                                             start=start)
        # Tokens sampled by an older version than ours (of mixed-version samples, by default) are corrected.
        stale = batch.versions_per_token() < self.version
        corrected = self.policy_loss.corrected_tokens(batch.response_mask, stale, batch.span_counts() > 1)
        several = self.config.ppo_epochs * self.config.num_mini_batches > 1
        extra.update(_version_metrics(batch, corrected))
        if bool(corrected.any()) or several:
            # Clip against the weights at the start of the step (several optimizer steps, or decoupled PPO).
            self.policy.eval()
            prox, _ = token_logprobs(self.policy, batch.input_ids, batch.attention_mask, temperature=temp,
                                     start=start)
            if self.policy_loss.needs_prox:  # uncorrected tokens: prox = their behaviour log-prob (ρ = 1)
                _, m = self.policy_loss.correction(prox, batch.old_logprobs, corrected)
                extra.update(m)
                prox = torch.where(corrected, prox, batch.old_logprobs)
            extra["prox"] = prox
        if self.adv_est.needs_values and batch.values is None:
            self.critic.eval()
            batch = batch.replace(values=critic_values(self.critic, batch.input_ids, batch.attention_mask))
        if batch.advantages is None:
            if self.adv_est.needs_groups and batch.group_ids is None:
                raise BatchError(f"advantage estimator {self.config.adv_est!r} needs Batch.group_ids")
            adv, ret = self.adv_est(rewards=batch.rewards, response_mask=batch.response_mask,
                                    group_ids=batch.group_ids, values=batch.values)
            batch = batch.replace(advantages=adv, returns=ret if batch.returns is None else batch.returns)
        if self.value_loss is not None and batch.returns is None:
            raise BatchError("PPO needs Batch.returns, or advantages left to the trainer's estimator")
        return batch, extra

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One RL update on `batch`; returns float metrics (loss, kl, entropy, clip_frac, grad_norm, ...)."""
        t0 = time.perf_counter()
        batch, extra = self.prepare(batch)
        c = self.config
        sums: dict[str, float] = defaultdict(float)
        n = 0
        gap: float | None = None
        for _ in range(c.ppo_epochs):
            for idx in torch.arange(len(batch)).tensor_split(c.num_mini_batches):
                mb = batch.select(idx)
                self.policy.train()
                lp, ent = token_logprobs(self.policy, mb.input_ids, mb.attention_mask, temperature=c.temperature,
                                         with_entropy=True, start=response_start(mb.response_mask))
                if gap is None:  # before this step's first update: the rollout's vs our log-probs
                    gap = _mismatch(lp.detach(), mb, self.version)
                loss, m = self.policy_loss(
                    logprobs=lp, old_logprobs=mb.old_logprobs, advantages=mb.advantages,
                    response_mask=mb.response_mask, entropy=ent,
                    prox_logprobs=extra["prox"][idx] if "prox" in extra else None,
                    ref_logprobs=extra["ref"][idx] if "ref" in extra else None)
                m["loss"] = float(loss.detach())
                m["grad_norm"] = self._step_policy(loss)
                if self.value_loss is not None:
                    self.critic.train()
                    v = critic_values(self.critic, mb.input_ids, mb.attention_mask)
                    vloss, vm = self.value_loss(values=v, old_values=mb.values, returns=mb.returns,
                                                response_mask=mb.response_mask)
                    vm["critic_grad_norm"] = self._step_critic(vloss)
                    m.update(vm)
                for k, v in m.items():
                    sums[k] += v
                n += 1
        self.version += 1
        out = {k: v / n for k, v in sums.items()}
        out.update(gap or {"logprob_gap": float("nan")})
        out.update({k: float(v) for k, v in extra.items() if k.startswith("offpolicy/")})
        out.update(self._batch_metrics(batch))
        out["step_time_s"] = time.perf_counter() - t0
        return out

    def _batch_metrics(self, batch: Batch) -> dict[str, float]:
        r = sequence_rewards(batch.rewards, batch.response_mask)
        stale = (self.version - 1 - batch.versions).float()
        out = {}
        if batch.group_ids is not None:
            # Groups whose answers all scored the same give GRPO no gradient: an early sign of collapse.
            _, std, _ = group_stats(r, batch.group_ids)
            _, first = _first_of_each_group(batch.group_ids)
            out["zero_spread_group_frac"] = float((std[first] == 0).float().mean())
        return out | {
            "reward_mean": float(r.float().mean()),
            "advantage_mean": float(masked_mean(batch.advantages, batch.response_mask)),
            "response_len_mean": float(batch.response_mask.float().sum(-1).mean()),
            "staleness_mean": float(stale.mean()),
            "staleness_max": float(stale.max()),
        }

    # ---- checkpoint -----------------------------------------------------------------------------
    def save_checkpoint(self, path: str) -> None:
        """Write everything resume needs under directory `path` (every rank calls it)."""
        raise NotImplementedError

    def load_checkpoint(self, path: str) -> None:
        raise NotImplementedError

    # ---- elastic group (docs/elastic.md) ----------------------------------------------------------
    def reform(self, dist: Any, load_weights: Callable[[dict[str, torch.Tensor]], int],
               model_factory: Callable[[], torch.nn.Module]) -> int:
        """Leave the current process group, join `dist` (a new size and port), and fill the policy's
        weights with `load_weights(name -> tensor to write)`, which returns their version (it becomes
        `self.version`). Every rank of the new group calls it; the optimizer is left as it was."""
        raise NotImplementedError

    can_reset_optimizer: bool = True
    """False: the optimizer is re-initialized by `reform` itself and `reset_optimizer` is not available."""

    def reset_optimizer(self) -> None:
        """Fresh optimizer state (moments zero, step 0) over the current parameters."""
        raise NotImplementedError

    def load_optimizer_state(self, path: str) -> bool:
        """Optimizer state only (no weights) from checkpoint `path`; False if this backend cannot."""
        return False


def _version_metrics(batch: Batch, corrected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Share of samples whose tokens span several versions, spans per sample, share of response tokens corrected
    (`offpolicy/clip_frac` and `offpolicy/weight_mean` come from the correction, when it ran)."""
    spans = batch.span_counts().float()
    return {"offpolicy/mixed_sample_frac": (spans > 1).float().mean(), "offpolicy/spans_per_sample": spans.mean(),
            "offpolicy/corrected_token_frac": masked_mean(corrected.float(), batch.response_mask),
            "offpolicy/clip_frac": torch.zeros(()), "offpolicy/weight_mean": torch.ones(())}


def _first_of_each_group(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique ids, index of each id's first sample)."""
    ids, inv = torch.unique(group_ids, return_inverse=True)
    first = torch.full((len(ids),), len(group_ids), dtype=torch.long).scatter_reduce(
        0, inv, torch.arange(len(group_ids)), reduce="amin")
    return ids, first


MISMATCH_CLIP = 0.2
"""`mismatch/is_clip_frac`: share of fresh tokens whose importance weight pi_trainer / pi_sampler is outside 1 +- this."""


def _mismatch(lp: torch.Tensor, mb: Batch, version: int) -> dict[str, float]:
    """Sampler vs trainer on the tokens of samples the trainer's current weights generated (a stale sample
    differs by the policy change too): the engine's numerics (vLLM's bf16, a quantized variant) against the
    trainer's. `logprob_gap` mean |difference|; `mismatch/k3` the k3 estimate of KL(sampler || trainer)
    (exp(d) - d - 1, d = trainer - sampler log-prob); `mismatch/is_clip_frac` the share of importance weights
    beyond 1 +- MISMATCH_CLIP. NaN when the mini-batch has no such sample."""
    fresh = (mb.versions == version).view(-1, 1) & mb.response_mask.bool()
    if not bool(fresh.any()):
        return {k: float("nan") for k in ("logprob_gap", "mismatch/k3", "mismatch/is_clip_frac")}
    d = (lp - mb.old_logprobs)[fresh]
    return {"logprob_gap": float(d.abs().mean()), "mismatch/k3": float((torch.exp(d) - d - 1).mean()),
            "mismatch/is_clip_frac": float(((torch.exp(d) - 1).abs() > MISMATCH_CLIP).float().mean())}
