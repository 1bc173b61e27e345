"""`RolloutWorker`: a rollout worker as a Ray actor — its engine takes versions from the run's weight-sync
route, generates, scores.

    rollout(prompts, min_version, samples=k) -> RolloutResult: makes the engine hold a version >= min_version
        first (waiting_weights, loading_weights), then generates and scores (generating); `samples`: how many
        responses it also returns as text (`RolloutResult.completions`, rlsync/telemetry/completions.py)
    join_run() -> where its first fetch read from (a worker joining a running job)

How weights reach the engine is the route's business (rlsync/sync/, `self.receiver`): by default the hub
fetches `latest` into `engine.named_parameters_for_sync()` once the version the request needs has
committed (one parked `wait_latest`, no polling); ZeRO-3 partitions are read back whole, vLLM stages.
The engine comes from the rollout-engine registry (`rollout.engine`, e.g. `hf`).

Its log (`<run dir>/logs/<pool>-<i>.log`, INFO) has a line per fetch (version, bytes, seconds, sources), per
rollout call (size, version, seconds, mean reward) and per error, with its traceback.

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

from rlsync.core.events import FetchEvent, JoinResult, RolloutResult
from rlsync.core.stall import StallClock
from rlsync.rollout.engine import RolloutEngine
from rlsync.rollout.episodes import generate_scored
from rlsync.sync import RunShape, Side, SyncConfig, choose_route
from rlsync.telemetry.completions import Completion, pick_samples
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


class _LoggedClock(StallClock):
    """The worker's stall clock, which also writes each fetch (whoever made it: the route, a prefetch
    thread) to the worker's log: one line per version taken, none per unit."""

    def event(self, name: str, **attrs):
        ev = super().event(name, **attrs)
        if name == FetchEvent.NAME:
            f = FetchEvent.from_attrs(attrs)
            log.info("fetched v%d (%s%s): %.2f MB in %.3f s from %s", f.version, f.mode, ", join" if f.join else "",
                     f.bytes / 1e6, f.seconds, ", ".join(f"{s} {n / 1e6:.2f} MB" for s, n in
                                                        sorted(f.bytes_by_source.items())) or "-")
        elif name == "fetch_retry":
            log.info("fetch retried after %s", attrs.get("error", "?"))
        return ev


@with_telemetry
class RolloutWorker:
    def __init__(self, pool: str, index: int, *, engine: RolloutEngine.Config, location: LocationConfig,
                 rollout: RolloutConfig, inject: InjectConfig, model: ModelConfig, task: TaskConfig, seed: int,
                 sync: SyncConfig, shape: RunShape, hub: HubAccess, setup: ProcessSetup):
        """Worker `index` of pool `pool`, with that pool's sampling (`engine`) and `location`."""
        _process_setup(setup, f"{pool}-{index}")
        from rlsync.rollout import build_engine, serving_gc

        self.pool, self.rollout_cfg, self.inject = pool, rollout, inject
        self.worker_id = f"{pool}-{index}"
        self.clock = _LoggedClock(self.worker_id, role="rollout", pool=pool)
        torch.manual_seed(seed * 1000 + index + 1)  # sampling differs per worker
        params, self.task = build_policy(model, task, seed)
        ecfg = dataclasses.replace(engine)
        if ecfg.max_new_tokens <= 0:
            ecfg.max_new_tokens = getattr(self.task, "response_len", 16)
        pad, eos = special_ids(self.task)
        route = choose_route(sync, shape)
        self.engine = build_engine(rollout.engine, ecfg, params, pad_token_id=pad, eos_token_id=eos, model_cfg=model,
                                   variant=route.engine_variant(sync))
        self.engine.version = -1  # nothing fetched yet: the random init is not a version
        self.hub = _hub_client(hub, location, self.worker_id)
        side = Side(sync=sync, model=hub.model, hub=self.hub, clock=self.clock, hub_address=hub.address, shape=shape)
        self.receiver = route.receiver(side, self.engine, params=params, delay_s=inject.weights_delay_s)
        serving_gc()  # start-up is over: no full GC pass over it inside a rollout (rollout/serving_gc.py)
        log.info("%s ready: engine %s, model %s, task %s, route %s, hub worker %s at %s", self.worker_id,
                 rollout.engine, model.kind, task.name, sync.mode, self.hub.worker_id, hub.address)

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

    def rollout(self, prompts: list, min_version: int, seed: int | None = None, samples: int = 0) -> RolloutResult:
        """Sample `group_size` responses per prompt with weights of version >= min_version, score them.
        `seed`: sampling starts from it (`deterministic=true`: the same prompts, weights and seed give the
        same responses on any worker); None: this worker's generator goes on.

        Returns one trainer `Batch` per prompt group (data, never weights), the version they came from, and
        `samples` of the responses decoded as `Completion`s (one per prompt first).
        """
        try:
            return self._rollout(prompts, min_version, seed, samples)
        except Exception:
            log.exception("rollout of %d prompts (min v%d) failed, holding v%d", len(prompts), min_version,
                          self.engine.version)
            raise

    def _rollout(self, prompts: list, min_version: int, seed: int | None, samples: int) -> RolloutResult:
        g = self.rollout_cfg.group_size
        held = self.engine.version
        self.receiver.ensure(min_version, eager=self.rollout_cfg.eager_fetch)
        if self.engine.version != held:
            log.info("holding v%d (was v%d; this call needs >= v%d)", self.engine.version, held, min_version)
        self.receiver.prefetch()                         # fetch what is newer while this batch generates
        t0 = time.perf_counter()
        if seed is not None:
            torch.manual_seed(seed)  # HF `generate` samples from the global generator
        with self.clock.state("generating"):
            out, rewards = generate_scored(self.engine, self.task, prompts, g)  # multi-turn: an episode loop
            group_ids = torch.tensor([p.index for p in prompts]).repeat_interleave(g)
            batch = out.to_batch(rewards, group_ids)
            if self.inject.generate_delay_s:
                time.sleep(self.inject.generate_delay_s)
        unverified = sorted(self.receiver.verify_generated())  # checks that ran while generating, or in flight
        if unverified:
            log.warning("rollout used v%s, which failed verification: the driver drops those samples", unverified)
        self.clock.enter("idle")
        groups = [batch.select(torch.arange(i * g, (i + 1) * g)) for i in range(len(prompts))]
        took = time.perf_counter() - t0
        log.info("rollout: %d prompts x %d = %d samples, %d response tokens, v%d, %.3f s, reward mean %.3f",
                 len(prompts), g, len(out.response_ids), sum(map(len, out.response_ids)), out.version, took,
                 float(rewards.mean()))
        return RolloutResult(worker=self.worker_id, version=out.version, groups=groups, generate_s=took,
                             completions=self._as_text(prompts, out, rewards, samples), unverified_versions=unverified)

    def _as_text(self, prompts: list, out, rewards: torch.Tensor, k: int) -> list[Completion]:
        """`k` of the call's responses decoded (the driver's sample of completions: a few strings, not the batch)."""
        g, tok = self.rollout_cfg.group_size, self.task.tokenizer
        return [Completion(prompt=prompts[i // g].text, response=tok.decode(out.response_ids[i]),
                           reward=float(rewards[i]), version=out.version, worker=self.worker_id,
                           prompt_index=prompts[i // g].index, response_tokens=len(out.response_ids[i]),
                           finished=out.response_ids[i][-1:] == [tok.eos_token_id])
                for i in pick_samples(len(out.response_ids), g, k)]

    def evaluate(self, prompts: list, min_version: int) -> dict[str, float]:
        """Greedy decoding of held-out prompts with weights of version >= min_version: mean reward, share fully right."""
        self.receiver.ensure(min_version, eager=self.rollout_cfg.eager_fetch)
        cfg = getattr(self.engine, "config", None) or self.engine.engine.config  # hf, or the vllm wrapper's engine
        was = cfg.do_sample
        cfg.do_sample = False
        try:
            with self.clock.state("generating"):
                out, rewards = generate_scored(self.engine, self.task, prompts, 1)
        finally:
            cfg.do_sample = was
            self.clock.enter("idle")
        if self.receiver.verify_generated():
            log.warning("evaluation at v%d used weights that then failed verification", out.version)
        r = rewards.tolist()
        return {"reward_mean": sum(r) / len(r), "accuracy": sum(x >= 1.0 for x in r) / len(r),
                "version": float(out.version), "mean_response_tokens": sum(map(len, out.response_ids)) / len(r)}

    def shutdown(self, deadline_s: float = 0.0) -> None:
        """Leave the hub; with `deadline_s` > 0 (a preemption notice) retention hands off what only we hold."""
        self.receiver.close()  # stop prefetching first
        self.hub.leave(deadline_s=deadline_s)

