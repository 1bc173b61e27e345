"""`TorchBackend`: the trainer on plain torch — one process, or DDP over gloo when world_size > 1.

    backend = TorchBackend(TorchBackend.Config(dist=DistConfig(world_size=2, rank=r, master_port=p)), model)
    backend.train_step(batch)                      # every rank passes its own share of the batch
    sd = backend.state_dict(); other.load_state_dict(sd)   # exact resume (weights, AdamW moments, version)

`named_parameters_for_sync()` returns the model's live parameter tensors (no copy): the optimizer
updates them in place, so the hub must release a published version before the next `train_step`.

Elastic (`reform`): tear the process group down, join one of the new size, re-wrap in DDP (whose
constructor broadcasts the new rank 0's weights: the critic, which the hub does not hold, comes from
a surviving rank that way), then overwrite the policy's live parameters with the hub's copy. The
optimizer keeps its state; `reset_optimizer` / `load_optimizer_state` replace it.

Checkpoint files: `model.pt` (weights, critic, version) and `optimizer.pt` (optimizer moments,
version), so a recovery can read optimizer state without reading any weights from disk.

Simplifies: fp32 on CPU; replicated weights (no sharding: use the DeepSpeed backend for ZeRO).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from rlsync.core.lora import LoraConfig, adapter_tensors, apply_lora, base_tensors

from .backend import TrainerBackend
from .distributed import DistConfig, init_process_group, leave_process_group
from .registry import register_backend

log = logging.getLogger(__name__)


@register_backend("torch")
class TorchBackend(TrainerBackend):
    @dataclass(kw_only=True)
    class Config(TrainerBackend.Config):
        dist: DistConfig = field(default_factory=DistConfig)
        """Process group; world_size 1 runs without one."""
        lora: LoraConfig = field(default_factory=LoraConfig)
        """rank > 0: train a LoRA adapter (peft) over the frozen model; each version is the adapter alone and
        the base is published once (`base_parameters_for_sync`, docs/lora.md)."""

    def _setup(self, model: torch.nn.Module, critic: torch.nn.Module | None) -> None:
        if self.config.lora.enabled:
            model = apply_lora(model, self.config.lora)
        self._model, self._critic = model, critic
        self._wrap(self.config.dist.resolved())
        self.reset_optimizer()

    def _wrap(self, dist: DistConfig) -> None:
        self.dist = dist
        self._policy, self._critic_wrapped = self._model, self._critic
        if dist.world_size > 1:
            init_process_group(dist)
            # DDP broadcasts rank 0's weights at construction: every rank starts identical.
            self._policy = DDP(self._model)
            self._critic_wrapped = DDP(self._critic) if self._critic is not None else None

    def reform(self, dist, load_weights, model_factory=None) -> int:
        self._policy = self._critic_wrapped = None  # DDP holds the old group: drop it first
        for m in (self._model, self._critic):  # a step cut short by a dead peer leaves partial grads
            for p in (m.parameters() if m is not None else ()):
                p.grad = None
        leave_process_group()
        self._wrap(dist.resolved())
        # Into the live parameters (the optimizer's): every rank gets the same bytes from the hub.
        self.version = int(load_weights(self.named_parameters_for_sync()))
        return self.version

    def reset_optimizer(self) -> None:
        # LoRA: only the adapter trains (the frozen base gets no moments)
        self.optimizer = self.config.optimizer.build([p for p in self._model.parameters() if p.requires_grad])
        self.critic_optimizer = (self.config.critic_optimizer.build(self._critic.parameters())
                                 if self._critic is not None else None)

    def load_optimizer_state(self, path: str) -> bool:
        f = os.path.join(path, "optimizer.pt")
        if not os.path.isfile(f):
            return False
        sd = torch.load(f, weights_only=True)
        self.optimizer.load_state_dict(sd["optimizer"])
        if self._critic is not None and "critic_optimizer" in sd:
            self.critic_optimizer.load_state_dict(sd["critic_optimizer"])
        return True

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
        if self.config.lora.enabled:  # a version is the adapter alone (its base: `base_parameters_for_sync`)
            return adapter_tensors(self._model)
        return {name: p.data for name, p in self._model.named_parameters()}

    def base_parameters_for_sync(self) -> dict[str, torch.Tensor]:
        """LoRA: name -> live tensor of the frozen base (HF names), published once; never written by a step."""
        if not self.config.lora.enabled:
            raise ValueError("base_parameters_for_sync: this trainer trains every parameter (trainer.lora.rank=0)")
        return base_tensors(self._model)

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
            sd = self.state_dict()
            opt = {k: sd.pop(k) for k in ("optimizer", "critic_optimizer") if k in sd}
            torch.save(sd, os.path.join(path, "model.pt"))
            torch.save({"version": sd["version"], **opt}, os.path.join(path, "optimizer.pt"))

    def load_checkpoint(self, path: str) -> None:
        legacy = os.path.join(path, "trainer.pt")  # one file (weights + optimizer), before the split
        if os.path.isfile(legacy):
            return self.load_state_dict(torch.load(legacy, weights_only=True))
        sd = torch.load(os.path.join(path, "model.pt"), weights_only=True)
        sd.update(torch.load(os.path.join(path, "optimizer.pt"), weights_only=True))
        self.load_state_dict(sd)


def _clone(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj
