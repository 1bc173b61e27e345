"""The trainer's registries: advantage estimators, policy and value losses, optimizer backends.

    @register_adv_est("rloo")
    class RLOOAdvantage(AdvantageEstimator): ...

    get_adv_est("rloo")            # -> RLOOAdvantage
    get_adv_est("nope")            # UnknownNameError: unknown advantage estimator 'nope'; known: gae, grpo, rloo
"""

from __future__ import annotations

from rlsync.core.registry import DuplicateNameError, Registry, UnknownNameError

__all__ = ["ADV_ESTIMATORS", "BACKENDS", "CORRECTIONS", "DuplicateNameError", "POLICY_LOSSES", "Registry",
           "UnknownNameError", "VALUE_LOSSES", "get_adv_est", "get_backend", "get_correction", "get_policy_loss",
           "get_value_loss", "register_adv_est", "register_backend", "register_correction", "register_policy_loss",
           "register_value_loss"]

ADV_ESTIMATORS: Registry = Registry("advantage estimator")
POLICY_LOSSES: Registry = Registry("policy loss")
VALUE_LOSSES: Registry = Registry("value loss")

register_adv_est = ADV_ESTIMATORS.register
get_adv_est = ADV_ESTIMATORS.get
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.get
register_value_loss = VALUE_LOSSES.register
get_value_loss = VALUE_LOSSES.get

CORRECTIONS: Registry = Registry("off-policy correction")
"""Per-token off-policy corrections a policy loss applies (`policy_loss_args.correction`): `tis`, `mask`."""
register_correction = CORRECTIONS.register
get_correction = CORRECTIONS.get

BACKENDS: Registry = Registry("trainer backend")
"""Optimizer backends (`trainer.backend`): `torch` (plain torch, DDP), `deepspeed` (ZeRO)."""
register_backend = BACKENDS.register
get_backend = BACKENDS.get
