"""`DeepSpeedBackend`: the trainer on DeepSpeed ZeRO (stage 0-3), CPU + gloo, torch's AdamW.

    backend = DeepSpeedBackend(DeepSpeedBackend.Config(zero_stage=3, dist=DistConfig(...)), model)
    backend.train_step(batch); backend.save_checkpoint(dir); backend.load_checkpoint(dir)

DeepSpeed always needs a process group, even at world size 1: the backend joins the one its
`DistConfig` names (MASTER_ADDR/PORT etc.). The first `deepspeed.init_distributed` on a machine
compiles an op (~65 s; cached under TORCH_EXTENSIONS_DIR).

Weights for the hub (`named_parameters_for_sync`):
- ZeRO 0-2 keep full parameters on every rank (stages 1-2 shard optimizer state and gradients):
  the live tensors are returned, no copy. DeepSpeed re-points parameters into its flat buffers at
  initialisation, so ask for them after construction (they stay put afterwards).
- ZeRO-3 shards the parameters themselves: each call all-gathers the full parameters (a collective:
  **every rank must call it**) and copies them into persistent full-size host buffers, which are
  returned. Cost per call: one all-gather of the model (bytes = model size × (world-1)/world per
  rank) plus one memcpy of the model, and a second full copy of the model resident per rank. The
  buffers keep their identity across calls, so the hub can register them once; they change only
  inside this call.

Elastic (`reform`), every ZeRO stage 0-3: a DeepSpeed engine is built for one world size (ZeRO
partitions, its flat buffers, its groups), so a new size means a new engine. The old engine and
process group are dropped, the new group joins, a fresh module is built (`model_factory`), the hub
writes the weights into its parameters, and only then `deepspeed.initialize` wraps it, so ZeRO's
fp32 partitions and ZeRO-3's parameter shards are cut from the hub's bytes. The optimizer state is
always re-initialized (a logged warning): ZeRO 1-3 keep it in per-rank shards laid out for the old
world size (re-sharding needs DeepSpeed's universal-checkpoint conversion), and stage 0 stores it in
the same file as the module weights. A critic (PPO) is not carried over: elastic PPO needs the
torch backend.

Checkpoints use DeepSpeed's own format (`engine.save_checkpoint`), which handles every stage and
sharded optimizer state; there is no in-memory `state_dict()` on this backend.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from .backend import TrainerBackend
from .distributed import DistConfig, export_env, leave_process_group
from .registry import register_backend

log = logging.getLogger(__name__)


@register_backend("deepspeed")
class DeepSpeedBackend(TrainerBackend):
    can_reset_optimizer = False

    @dataclass(kw_only=True)
    class Config(TrainerBackend.Config):
        zero_stage: int = 2
        """ZeRO stage: 0 plain DP, 1 shard optimizer state, 2 + gradients, 3 + parameters."""
        dist: DistConfig = field(default_factory=DistConfig)
        """Process group (DeepSpeed needs one even for a single process)."""
        extra_ds_config: dict[str, Any] = field(default_factory=dict)
        """Merged into the generated DeepSpeed config (top-level keys), for knobs not exposed here."""

    def _ds_config(self, opt_lr: float) -> dict[str, Any]:
        c = self.config
        if c.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0-3, got {c.zero_stage}")
        cfg: dict[str, Any] = {
            # The batch is split by this backend, not by DeepSpeed's dataloader: sizes are nominal.
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "train_batch_size": self.dist.world_size,
            "zero_optimization": {"stage": c.zero_stage},
            "zero_allow_untested_optimizer": True,
            "gradient_clipping": c.grad_clip if c.grad_clip is not None else 0.0,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        cfg.update(c.extra_ds_config)
        return cfg

    def _setup(self, model: torch.nn.Module, critic: torch.nn.Module | None) -> None:
        self._join(self.config.dist.resolved())
        self._initialize(model, critic)

    def _join(self, dist: DistConfig) -> None:
        import deepspeed  # imported here: it takes seconds and logs at import

        self.dist = dist
        export_env(dist)
        kw = {"timeout": timedelta(seconds=dist.timeout_s)} if dist.timeout_s else {}
        deepspeed.init_distributed(dist_backend=dist.backend, auto_mpi_discovery=False, **kw)

    def _initialize(self, model: torch.nn.Module, critic: torch.nn.Module | None) -> None:
        import deepspeed

        self._module = model
        self._engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=self.config.optimizer.build(model.parameters()),
            config=self._ds_config(self.config.optimizer.lr))
        self._critic_engine = None
        if critic is not None:
            self._critic_engine, _, _, _ = deepspeed.initialize(
                model=critic, optimizer=self.config.critic_optimizer.build(critic.parameters()),
                config=self._ds_config(self.config.critic_optimizer.lr))
        if self.ref_model is not None and self.config.zero_stage == 3:
            log.warning("the reference model is kept whole on every rank (not ZeRO-3 sharded)")
        self._sync_buffers: dict[str, torch.Tensor] | None = None
        self.gathered_bytes = getattr(self, "gathered_bytes", 0)
        """Bytes of full-model copies gathered by `named_parameters_for_sync` under ZeRO-3 (cumulative)."""

    def reform(self, dist, load_weights, model_factory) -> int:
        import deepspeed.comm as dsc

        if self._critic_engine is not None:
            raise NotImplementedError("elastic DeepSpeed does not carry a critic over (PPO): use trainer.backend=torch")
        self._engine = self.optimizer = self._module = self._sync_buffers = None
        if dsc.is_initialized():
            try:
                dsc.destroy_process_group()  # also drops DeepSpeed's cached groups
            except Exception as e:  # noqa: BLE001 - a group whose peer died may not shut down cleanly
                log.warning("destroying the DeepSpeed process group: %s", e)
        leave_process_group()
        self._join(dist.resolved())
        if self.config.zero_stage == 3:
            # ZeRO-3 numbers parameters and modules per process (`ds_id`: a class counter and a mutable
            # default argument) and checks the numbers agree across ranks: restart both, or a joiner
            # (fewer engines built so far) disagrees with the survivors at its first gather.
            from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
            from deepspeed.runtime.zero.partition_parameters import Init

            Init.param_id = 0
            DeepSpeedZeRoOffload._register_deepspeed_module.__defaults__[0][0] = 0
        model = model_factory()
        # Before initialize: ZeRO cuts its fp32 partitions / ZeRO-3 shards from these bytes.
        version = int(load_weights({n: p.data for n, p in model.named_parameters()}))
        self._initialize(model, None)
        self.version = version
        log.warning("DeepSpeed re-formed at world size %d: optimizer state re-initialized "
                    "(ZeRO's optimizer shards are laid out for the old world size)", dist.world_size)
        return version

    def reset_optimizer(self) -> None:
        raise NotImplementedError("DeepSpeed: the optimizer is re-initialized by reform()")

    @property
    def policy(self) -> torch.nn.Module:
        return self._engine

    @property
    def critic(self) -> torch.nn.Module | None:
        return self._critic_engine

    @property
    def engine(self):
        """The policy's DeepSpeed engine."""
        return self._engine

    def _step(self, loss: torch.Tensor, engine) -> float:
        engine.backward(loss)
        norm = None
        if self.config.zero_stage == 0 and self.config.grad_clip is None:
            # Stage 0 without clipping computes no norm; compute it for the metrics.
            norm = torch.nn.utils.clip_grad_norm_(engine.module.parameters(), float("inf"))
        engine.step()
        if norm is None:
            norm = engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def _step_policy(self, loss: torch.Tensor) -> float:
        return self._step(loss, self._engine)

    def _step_critic(self, loss: torch.Tensor) -> float:
        return self._step(loss, self._critic_engine)

    def named_parameters_for_sync(self) -> dict[str, torch.Tensor]:
        if self.config.zero_stage < 3:
            return {name: p.data for name, p in self._module.named_parameters()}
        import deepspeed

        params = dict(self._module.named_parameters())
        if self._sync_buffers is None:
            self._sync_buffers = {n: torch.empty(p.ds_shape, dtype=p.dtype) for n, p in params.items()}
        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
            for n, p in params.items():
                self._sync_buffers[n].copy_(p.data.view(p.ds_shape))
        self.gathered_bytes += sum(b.numel() * b.element_size() for b in self._sync_buffers.values())
        return self._sync_buffers

    def named_partitions_for_sync(self) -> tuple[int, int, dict[str, tuple[torch.Tensor, tuple[int, ...]]]]:
        """ZeRO-3: (rank, world, name -> (this rank's live flat partition, the full shape)), no gather
        and no copy: the partitions DeepSpeed keeps (`p.ds_tensor`, ceil(numel / world) elements,
        the last rank's padded), updated in place by each step. A sharded publish hands these out
        (rlsync.hub.reshard.layout records how they map onto the full parameters)."""
        if self.config.zero_stage != 3:
            raise ValueError(f"named_partitions_for_sync needs ZeRO-3 (zero_stage is {self.config.zero_stage}): "
                             "stages 0-2 hold full parameters, use named_parameters_for_sync")
        return self.dist.rank, self.dist.world_size, {
            n: (p.ds_tensor.data, tuple(p.ds_shape)) for n, p in self._module.named_parameters()}

    def save_checkpoint(self, path: str) -> None:
        self._engine.save_checkpoint(path, tag="policy", client_state={"version": self.version})
        if self._critic_engine is not None:
            self._critic_engine.save_checkpoint(path, tag="critic")

    def load_checkpoint(self, path: str) -> None:
        _, client = self._engine.load_checkpoint(path, tag="policy")
        if client is None:
            raise FileNotFoundError(f"no DeepSpeed policy checkpoint under {os.path.abspath(path)}")
        if self._critic_engine is not None:
            self._critic_engine.load_checkpoint(path, tag="critic")
        self.version = int(client["version"])
