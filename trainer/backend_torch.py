"""`TorchBackend`: the trainer on plain torch — one process, or DDP over gloo when world_size > 1.

    backend = TorchBackend(TorchBackend.Config(dist=DistConfig(world_size=2, rank=r, master_port=p)), model)
    backend.train_step(batch)                      # every rank passes its own share of the batch
    sd = backend.state_dict(); other.load_state_dict(sd)   # exact resume (weights, AdamW moments, version)

`named_parameters_for_sync()` returns the model's live parameter tensors (no copy): the optimizer
updates them in place, so the hub must release a published version before the next `train_step`.

Simplifies: fp32 on CPU; replicated weights (no sharding: use the DeepSpeed backend for ZeRO).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from .backend import TrainerBackend
from .distributed import DistConfig, init_process_group

log = logging.getLogger(__name__)


class TorchBackend(TrainerBackend):
    @dataclass(kw_only=True)
    class Config(TrainerBackend.Config):
        dist: DistConfig = field(default_factory=DistConfig)
        """Process group; world_size 1 runs without one."""

    def _setup(self, model: torch.nn.Module, critic: torch.nn.Module | None) -> None:
        self.dist = self.config.dist.resolved()
        self._model, self._critic = model, critic
        self._policy, self._critic_wrapped = model, critic
        if self.dist.world_size > 1:
            init_process_group(self.dist)
            # DDP broadcasts rank 0's weights at construction: every rank starts identical.
            self._policy = DDP(model)
            self._critic_wrapped = DDP(critic) if critic is not None else None
        self.optimizer = self.config.optimizer.build(model.parameters())
        self.critic_optimizer = self.config.critic_optimizer.build(critic.parameters()) if critic is not None else None

    @property
    def policy(self) -> torch.nn.Module:
        return self._policy

    @property
    def critic(self) -> torch.nn.Module | None:
        return self._critic_wrapped

    @property
    def model(self) -> torch.nn.Module:
        """The bare policy model (unwrapped)."""
        return self._model

    def _step(self, loss: torch.Tensor, module: torch.nn.Module, opt: torch.optim.Optimizer) -> float:
        loss.backward()
        max_norm = self.config.grad_clip if self.config.grad_clip is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(norm)

    def _step_policy(self, loss: torch.Tensor) -> float:
        return self._step(loss, self._model, self.optimizer)

    def _step_critic(self, loss: torch.Tensor) -> float:
        return self._step(loss, self._critic, self.critic_optimizer)

    def named_parameters_for_sync(self) -> dict[str, torch.Tensor]:
        # `.data`: the same storage as the parameter, without autograd history. Tied weights
        # (embed/lm_head) appear once, under the name `named_parameters()` gives them.
        return {name: p.data for name, p in self._model.named_parameters()}

    def state_dict(self) -> dict[str, Any]:
        """Everything resume needs: weights, optimizer moments, critic, version (tensors are copies)."""
        sd: dict[str, Any] = {
            "version": self.version,
            "model": {k: v.detach().clone() for k, v in self._model.state_dict().items()},
            "optimizer": _clone(self.optimizer.state_dict()),
        }
        if self._critic is not None:
            sd["critic"] = {k: v.detach().clone() for k, v in self._critic.state_dict().items()}
            sd["critic_optimizer"] = _clone(self.critic_optimizer.state_dict())
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        # Copies into the existing parameters: tensors handed out by named_parameters_for_sync stay valid.
        self._model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        if self._critic is not None:
            if "critic" not in sd:
                raise KeyError("checkpoint has no critic, but this trainer has one (PPO)")
            self._critic.load_state_dict(sd["critic"])
            self.critic_optimizer.load_state_dict(sd["critic_optimizer"])
        self.version = int(sd["version"])

    def save_checkpoint(self, path: str) -> None:
        if self.dist.rank == 0:  # replicated weights: one copy is the whole state
            os.makedirs(path, exist_ok=True)
            torch.save(self.state_dict(), os.path.join(path, "trainer.pt"))

    def load_checkpoint(self, path: str) -> None:
        self.load_state_dict(torch.load(os.path.join(path, "trainer.pt"), weights_only=True))


def _clone(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj
