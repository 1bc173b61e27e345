"""rlsync.trainer: the policy/critic update — losses, advantage estimators, optimizer backends.

Importing the package registers the built-ins (grpo, gae, rloo estimators; grpo, ppo_clip policy
losses; the tis and mask off-policy corrections; the clipped value loss; the torch and deepspeed
backends). See docs/trainer.md.
Room rule: imports `rlsync.core`, never `rlsync.rollout`, the hub or driver files (pyproject's
import-linter contracts, checked by tests/test_rooms.py).
"""

from rlsync.core.batch import Batch, BatchError
from rlsync.core.logprobs import critic_values, token_logprobs

from . import (adv_gae, adv_grpo, adv_rloo, correction_mask, correction_tis, loss_grpo, loss_ppo_clip,  # noqa: F401
               loss_value)  # (registers)
from .advantage import AdvantageEstimator, build_adv_est
from .backend import OptimizerConfig, TrainerBackend
from .backend_deepspeed import DeepSpeedBackend
from .backend_torch import TorchBackend
from .critic import ValueModel
from .distributed import DistConfig, free_port, init_process_group
from .policy_loss import PolicyLoss, build_policy_loss
from .registry import (BACKENDS, UnknownNameError, get_adv_est, get_backend, get_policy_loss, get_value_loss,
                       register_adv_est, register_backend, register_policy_loss, register_value_loss)

__all__ = [
    "AdvantageEstimator", "BACKENDS", "Batch", "BatchError", "DeepSpeedBackend", "DistConfig", "OptimizerConfig",
    "PolicyLoss", "TorchBackend", "TrainerBackend", "UnknownNameError", "ValueModel", "build_adv_est",
    "build_policy_loss", "critic_values", "free_port", "get_adv_est", "get_backend", "get_policy_loss",
    "get_value_loss", "init_process_group", "register_adv_est", "register_backend", "register_policy_loss",
    "register_value_loss", "token_logprobs",
]
