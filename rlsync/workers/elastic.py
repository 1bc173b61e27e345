"""The trainer group's configuration (the run's `trainer` section) and its pure logic (no Ray, no I/O).

    t = TrainerGroupConfig(world_size=2)                    # trainer.world_size=2
    cfg = ElasticConfig(enabled=True)                       # trainer.elastic.enabled=true
    churn = TrainerChurnConfig(kill_at=[6], join_at=[10])   # trainer.churn.kill_at=[6] ...
    split_groups(list(range(5)), 2)                         # [[0, 1, 2], [3, 4]]: whole groups per rank
    churn.kills_during(6)                                   # 1: kill one rank while step 6 trains

What the group does with them is rlsync/workers/trainer_group.py; the rule and the commands are docs/elastic.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Sequence, TypeVar

from rlsync.core.lora import LoraConfig
from rlsync.trainer.backend import OptimizerConfig, TrainerBackend
from rlsync.workers.process import LocationConfig

__all__ = ["ElasticConfig", "OptimizerState", "RUN_LR", "TrainerChurnConfig", "TrainerGroupConfig", "split_groups",
           "OPTIMIZER_STATE"]

T = TypeVar("T")

class OptimizerState(str, Enum):
    """Where a re-formed group's optimizer state comes from (`trainer.elastic.optimizer_state`)."""

    checkpoint = "checkpoint"
    reinit = "reinit"


OPTIMIZER_STATE = tuple(m.value for m in OptimizerState)


@dataclass(kw_only=True)
class ElasticConfig:
    enabled: bool = False
    """Re-form the trainer group when a rank dies (and admit ranks added mid-run) instead of ending the run."""
    optimizer_state: OptimizerState = OptimizerState.checkpoint
    """After a re-form: `checkpoint` loads the optimizer state (only; weights come from the hub) of the
    newest committed checkpoint, or re-initializes it with a warning when there is none or the backend
    cannot (DeepSpeed); `reinit` always starts it fresh (warning)."""
    collective_timeout_s: float = 30.0
    """Gloo timeout of the group's collectives: a rank blocked on a dead peer fails after this long at most."""
    min_world_size: int = field(default=1, metadata={"ge": 1})
    """Fewest ranks the group may shrink to; below it the run ends (RunError)."""
    max_recoveries: int = 8
    """Re-forms after a loss the run may take before it gives up."""
    ping_timeout_s: float = 10.0
    """How long a rank has to answer the liveness probe after a failed step before it counts as lost."""
    backup_replica: bool = True
    """With >= 2 ranks, rank 1 fetches every version rank 0 publishes into a host copy it keeps serving
    until the next one (one model copy per step): losing the publisher never loses the latest committed
    version, even before any rollout worker has fetched it."""


@dataclass(kw_only=True)
class TrainerChurnConfig:
    """Injected trainer churn (tests, demos): deterministic, by step."""

    kill_at: list[int] = field(default_factory=list)
    """Kill one trainer rank without notice (`ray.kill`) while this step trains (step s publishes version s)."""
    kill_rank: int = -1
    """Which rank such a kill hits (-1: the last one; 0: the publisher)."""
    join_at: list[int] = field(default_factory=list)
    """Start a new trainer worker after this step closes; it joins at the first step boundary once ready."""
    wait_for_join: bool = False
    """The next step boundary waits for a worker the schedule added to be ready (deterministic tests);
    off: training goes on and the worker joins at the first boundary it is ready by."""

    def kills_during(self, step: int) -> int:
        return self.kill_at.count(step)

    def joins_after(self, step: int) -> int:
        return self.join_at.count(step)


RUN_LR = 1e-3
"""The run's default policy learning rate (the optimizer's own default suits real models)."""

ALGO_BOUNDS: dict[str, dict[str, Any]] = {
    "optimizer.lr": {"gt": 0}, "critic_optimizer.lr": {"gt": 0}, "grad_clip": {"gt": 0},
    "ppo_epochs": {"ge": 1}, "num_mini_batches": {"ge": 1}, "temperature": {"gt": 0}}
"""Bounds of the trainer's own `TrainerBackend.Config` fields, as the run checks them (rlsync/config/rules.py)."""


@dataclass(kw_only=True)
class TrainerGroupConfig:
    backend: str = "torch"
    """`torch` (plain torch, DDP over gloo when world_size > 1) or `deepspeed` (ZeRO)."""
    world_size: int = field(default=1, metadata={"ge": 1})
    """Data-parallel trainer actors; each takes whole prompt groups of the batch."""
    zero_stage: int = field(default=2, metadata={"ge": 0, "le": 3})
    """DeepSpeed ZeRO stage (backend=deepspeed)."""
    extra_ds_config: dict[str, Any] = field(default_factory=dict)
    """Merged into the DeepSpeed config (backend=deepspeed)."""
    publish: str = field(default="auto", metadata={"one_of": ("auto", "gathered", "sharded")})
    """How each version reaches the hub: `gathered` (rank 0 publishes the whole model; under ZeRO-3 every rank
    all-gathers it first), `sharded` (DeepSpeed ZeRO-3: every rank publishes its own live partition, no gather;
    readers reassemble whole tensors, docs/resharding.md) or `auto` (sharded for ZeRO-3 on the hub route, no
    elastic group, seed DCs or deltas; else gathered)."""
    algo: TrainerBackend.Config = field(default_factory=lambda: TrainerBackend.Config(
        optimizer=OptimizerConfig(lr=RUN_LR)), metadata={"bounds": ALGO_BOUNDS})
    """The update: optimizer, advantage estimator, policy loss (GRPO, PPO ...), epochs. Composed runs pick a typed
    algorithm (`trainer/algo=grpo|ppo|custom`, trainer/algos.py) whose args are typed fields, not free dicts."""
    location: LocationConfig = field(default_factory=LocationConfig)
    """Where the trainer ranks are (hub topology labels)."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Elastic group: re-form when a rank dies, admit ranks added mid-run; weights back from the hub (docs/elastic.md)."""
    churn: TrainerChurnConfig = field(default_factory=TrainerChurnConfig)
    """Injected trainer churn: kill a rank during step s, add one after step s (needs elastic.enabled)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """rank > 0: train a LoRA adapter over the frozen model (backend=torch); the base is published once, each
    version is the adapter alone and engines hold many adapters over one base (docs/lora.md)."""


def split_groups(items: Sequence[T], ranks: int) -> list[list[T]]:
    """Whole prompt groups over `ranks`, in order, sizes differing by at most one (a re-formed group
    may not divide the batch evenly). Every rank gets at least one group when there are enough."""
    if ranks < 1:
        raise ValueError("ranks must be >= 1")
    if len(items) < ranks:
        raise ValueError(f"{len(items)} prompt groups cannot feed {ranks} trainer ranks")
    per, extra = divmod(len(items), ranks)
    out, i = [], 0
    for r in range(ranks):
        n = per + (r < extra)
        out.append(list(items[i:i + n]))
        i += n
    return out
