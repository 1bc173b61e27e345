"""Algorithms as typed configs: which advantage estimator and losses, with their args typed.

`TrainerBackend.Config` takes the components' args as free dicts (any registered component, any
args). An algorithm here narrows it: its fields name the components and type their args with the
components' own `Config` classes, so a run's config (Hydra group `trainer/algo`, registered by
`rlsync.config.compose.register_configs`) shows every arg with its default and refuses a typo'd or
ill-typed one when the config is composed:

    python -m rlsync.train +recipe=grpo_standalone trainer.algo.policy_loss_args.kl_coef=0.01
    python -m rlsync.train +recipe=grpo_standalone trainer/algo=ppo     # GAE + critic + clipped losses
    python -m rlsync.train +recipe=grpo_standalone trainer/algo=custom  # free dict args (plugins)

`as_backend_config` turns the typed config back into the `TrainerBackend.Config` the backend builds from.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rlsync.core.registry import Registry

from .adv_gae import GAEAdvantage
from .adv_grpo import GRPOAdvantage
from .backend import TrainerBackend
from .loss_grpo import GRPOLoss
from .loss_ppo_clip import PPOClipLoss
from .loss_value import ClippedValueLoss
from .registry import ADV_ESTIMATORS, POLICY_LOSSES, VALUE_LOSSES

ALGORITHMS: Registry = Registry("algorithm")
"""Typed algorithm configs (`trainer/algo=NAME`)."""


@ALGORITHMS.register("grpo")
@dataclass(kw_only=True)
class GRPO(TrainerBackend.Config):
    """GRPO: group-relative advantages, clipped surrogate, optional KL to the initial policy."""

    adv_est: str = "grpo"
    """Registered advantage estimator; its args are typed as GRPOAdvantage.Config."""
    adv_est_args: GRPOAdvantage.Config = field(default_factory=GRPOAdvantage.Config)
    """GRPO advantage: norm_by_std, eps."""
    policy_loss: str = "grpo"
    """Registered policy loss; its args are typed as GRPOLoss.Config."""
    policy_loss_args: GRPOLoss.Config = field(default_factory=GRPOLoss.Config)
    """clip_eps, clip_eps_high, correction, tis_cap, correct, entropy_coef, loss_agg, kl_coef."""


@ALGORITHMS.register("ppo")
@dataclass(kw_only=True)
class PPO(TrainerBackend.Config):
    """PPO: a critic, GAE advantages, clipped surrogate and clipped value loss."""

    adv_est: str = "gae"
    """Registered advantage estimator; its args are typed as GAEAdvantage.Config."""
    adv_est_args: GAEAdvantage.Config = field(default_factory=GAEAdvantage.Config)
    """GAE: gamma, lam, whiten."""
    policy_loss: str = "ppo_clip"
    """Registered policy loss; its args are typed as PPOClipLoss.Config."""
    policy_loss_args: PPOClipLoss.Config = field(default_factory=PPOClipLoss.Config)
    """clip_eps, clip_eps_high, correction, tis_cap, correct, entropy_coef, loss_agg."""
    value_loss_args: ClippedValueLoss.Config = field(default_factory=ClippedValueLoss.Config)
    """Clipped value loss: clip, coef."""


ALGORITHMS.register("custom")(TrainerBackend.Config)  # free dict args, checked against the components named


def as_backend_config(algo: TrainerBackend.Config) -> TrainerBackend.Config:
    """The `TrainerBackend.Config` (args as dicts) of a typed algorithm config; others pass through.

    A typed arg the named component does not declare is passed only if it was changed from its
    default (then the component refuses it): `trainer/algo=grpo trainer.algo.policy_loss=ppo_clip` runs,
    `... policy_loss_args.kl_coef=0.1` with `ppo_clip` is refused by name."""
    if type(algo) is TrainerBackend.Config:
        return algo
    kw = {f.name: getattr(algo, f.name) for f in dataclasses.fields(TrainerBackend.Config)}
    for name, registry, chosen in (("adv_est_args", ADV_ESTIMATORS, algo.adv_est),
                                   ("policy_loss_args", POLICY_LOSSES, algo.policy_loss),
                                   ("value_loss_args", VALUE_LOSSES, "clipped")):
        args = kw[name]
        if dataclasses.is_dataclass(args):
            declared = {f.name for f in dataclasses.fields(registry.get(chosen).Config)} if chosen in registry else set()
            default = type(args)()
            kw[name] = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)
                        if f.name in declared or getattr(args, f.name) != getattr(default, f.name)}
    return TrainerBackend.Config(**kw)
