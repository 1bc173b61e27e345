"""`RolloutWorker`: a rollout worker as a Ray actor — its engine takes versions from the run's weight-sync
route, generates, scores.

    rollout(prompts, min_version) -> RolloutResult: makes the engine hold a version >= min_version first
        (waiting_weights, loading_weights), then generates and scores (generating)
    join_run() -> where its first fetch read from (a worker joining a running job)

How weights reach the engine is the route's business (rlsync/sync/, `self.receiver`): by default the hub
fetches `latest` into `engine.named_parameters_for_sync()` once the version the request needs has
committed (one parked `wait_latest`, no polling); ZeRO-3 partitions are read back whole, vLLM stages.
The engine comes from the rollout-engine registry (`rollout.engine`, e.g. `hf`).

A worker is built from the sections it reads (its pool's `engine` and `location`, the run's `rollout`,
`inject`, `model`, `task`, `sync`) plus the run's seed, the route's `RunShape` and the hub's address:

    RolloutWorker(pool="main", index=0, engine=RolloutEngine.Config(), location=LocationConfig(),
                  rollout=RolloutConfig(), inject=InjectConfig(), model=ModelConfig(), task=TaskConfig(), seed=0,
                  sync=SyncConfig(), shape=RunShape(), hub=HubAccess(address=..., token=...), setup=ProcessSetup())
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import torch

from rlsync.core.events import JoinResult, RolloutResult
from rlsync.core.stall import StallClock
from rlsync.rollout.engine import RolloutEngine
from rlsync.sync import RunShape, Side, SyncConfig, choose_route
from rlsync.workers.policy import ModelConfig, TaskConfig, build_policy, special_ids
from rlsync.workers.process import (HubAccess, LocationConfig, ProcessSetup, hub_client as _hub_client,
                                    process_setup as _process_setup, with_telemetry)

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class RolloutConfig:
    prompts_per_step: int = field(default=32, metadata={"ge": 1})
    """Distinct prompts per trainer step."""
    group_size: int = field(default=8, metadata={"ge": 1})
    """Responses sampled per prompt (the GRPO group)."""
    prompts_per_request: int | None = field(default=None, metadata={"ge": 1})
    """Prompts per call to one rollout worker; None: prompts_per_step / (all rollout workers)."""
    max_staleness: int = field(default=1, metadata={"ge": 0})
    """k: how far ahead generation runs; a request for step t starts from version >= t - k (0 = synchronous).
    Until issue 32 it was also the drop rule; that is now `max_off_policy_versions`."""
    max_off_policy_versions: int | None = field(default=None, metadata={"ge": 0})
    """Version-age cap: a sample whose oldest token's version v is trained at step s with s - v > cap is dropped
    (counted, `staleness/dropped`); younger ones are trained, corrected by the loss (trainer/policy_loss.py). Must be
    >= max_staleness. None: max(max_staleness, 4). Set it to max_staleness for the old drop rule."""
    eager_fetch: bool = False
    """Also fetch `latest` when a newer version exists and the bound does not require it yet."""
    engine: str = "hf"
    """Rollout engine (registry `rlsync.rollout.registry.ENGINES`): `hf` (HF generate; tiny models, CPU) or
    `vllm` (vLLM, model.kind=smollm2; weights through a host staging replica, docs/vllm.md)."""


@dataclass(kw_only=True)
class InjectConfig:
    """Known delays, for tests of the stall metrics (0 in real runs)."""

    weights_delay_s: float = field(default=0.0, metadata={"ge": 0})
    """Each rollout worker sleeps this long in `waiting_weights` before every fetch."""
    generate_delay_s: float = field(default=0.0, metadata={"ge": 0})
    """Each rollout call sleeps this long in `generating` (starves the trainer of data)."""


@with_telemetry
class RolloutWorker:
    def __init__(self, pool: str, index: int, *, engine: RolloutEngine.Config, location: LocationConfig,
                 rollout: RolloutConfig, inject: InjectConfig, model: ModelConfig, task: TaskConfig, seed: int,
                 sync: SyncConfig, shape: RunShape, hub: HubAccess, setup: ProcessSetup):
        """Worker `index` of pool `pool`, with that pool's sampling (`engine`) and `location`."""
        _process_setup(setup, f"{pool}-{index}")
        from rlsync.rollout import build_engine

        self.pool, self.rollout_cfg, self.inject = pool, rollout, inject
        self.worker_id = f"{pool}-{index}"
        self.clock = StallClock(self.worker_id, role="rollout", pool=pool)
        torch.manual_seed(seed * 1000 + index + 1)  # sampling differs per worker
        params, self.task = build_policy(model, task, seed)
        ecfg = dataclasses.replace(engine)
        if ecfg.max_new_tokens <= 0:
            ecfg.max_new_tokens = getattr(self.task, "response_len", 16)
        pad, eos = special_ids(self.task)
        self.engine = build_engine(rollout.engine, ecfg, params, pad_token_id=pad, eos_token_id=eos, model_cfg=model)
        self.engine.version = -1  # nothing fetched yet: the random init is not a version
        self.hub = _hub_client(hub, location, self.worker_id)
        side = Side(sync=sync, model=hub.model, hub=self.hub, clock=self.clock, hub_address=hub.address, shape=shape)
        self.receiver = choose_route(sync, shape).receiver(side, self.engine, params=params,
                                                           delay_s=inject.weights_delay_s)

    def sync_connect(self, arg, meta: dict) -> str:
        """The driver's set-up of the route (broadcast: join the static group; blocks until all have)."""
        self.receiver.connect(arg, meta)
        return self.worker_id

    def sync_push(self) -> int:
        """The driver's call after each publish (broadcast: take part in the trainer's broadcast; blocks)."""
        return self.receiver.push()

    def ready(self) -> str:
        return self.worker_id

    def join_run(self) -> JoinResult:
        """Become useful to a running job: take `latest` now (the planner prefers peers near this worker
        over the trainer), before the driver hands out work. Before the first publish: no-op.

        Returns the hub worker id (the driver's map of sources) and what the fetch read from whom.
        """
        by_source = self.receiver.join()
        self.clock.enter("idle")
        return JoinResult(worker=self.worker_id, wid=self.hub.worker_id, pool=self.pool, dc=self.hub.location.dc,
                          version=self.engine.version, bytes_by_source=by_source)

    def rollout(self, prompts: list, min_version: int) -> RolloutResult:
        """Sample `group_size` responses per prompt with weights of version >= min_version, score them.

        Returns one trainer `Batch` per prompt group (data, never weights) and the version they came from.
        """
        g = self.rollout_cfg.group_size
        self.receiver.ensure(min_version, eager=self.rollout_cfg.eager_fetch)
        self.receiver.prefetch()                         # fetch what is newer while this batch generates
        t0 = time.perf_counter()
        with self.clock.state("generating"):
            out = self.engine.generate([p.prompt_ids for p in prompts for _ in range(g)])
            rewards = torch.tensor([self.task.score(prompts[i // g], r) for i, r in enumerate(out.response_ids)],
                                   dtype=torch.float32)
            group_ids = torch.tensor([p.index for p in prompts]).repeat_interleave(g)
            batch = out.to_batch(rewards, group_ids)
            if self.inject.generate_delay_s:
                time.sleep(self.inject.generate_delay_s)
        self.clock.enter("idle")
        groups = [batch.select(torch.arange(i * g, (i + 1) * g)) for i in range(len(prompts))]
        return RolloutResult(worker=self.worker_id, version=out.version, groups=groups,
                             generate_s=time.perf_counter() - t0)

    def evaluate(self, prompts: list, min_version: int) -> dict[str, float]:
        """Greedy decoding of held-out prompts with weights of version >= min_version: mean reward, share fully right."""
        self.receiver.ensure(min_version, eager=self.rollout_cfg.eager_fetch)
        cfg = getattr(self.engine, "config", None) or self.engine.engine.config  # hf, or the vllm wrapper's engine
        was = cfg.do_sample
        cfg.do_sample = False
        try:
            with self.clock.state("generating"):
                out = self.engine.generate([p.prompt_ids for p in prompts])
        finally:
            cfg.do_sample = was
            self.clock.enter("idle")
        r = [self.task.score(p, ids) for p, ids in zip(prompts, out.response_ids)]
        return {"reward_mean": sum(r) / len(r), "accuracy": sum(x >= 1.0 for x in r) / len(r),
                "version": float(out.version), "mean_response_tokens": sum(map(len, out.response_ids)) / len(r)}

    def shutdown(self, deadline_s: float = 0.0) -> None:
        """Leave the hub; with `deadline_s` > 0 (a preemption notice) retention hands off what only we hold."""
        self.receiver.close()  # stop prefetching first
        self.hub.leave(deadline_s=deadline_s)

