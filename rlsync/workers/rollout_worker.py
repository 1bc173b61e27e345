"""`RolloutWorker`: a rollout worker as a Ray actor — fetch `latest` from the hub into its engine, generate, score.

    rollout(prompts, min_version) -> RolloutResult: fetches `latest` first when its weights are older
        than min_version (waiting_weights, loading_weights), then generates and scores (generating)
    join_run() -> where its first fetch read from (a worker joining a running job)

Weights reach the engine only through the hub: `hub.fetch(..., into=engine.named_parameters_for_sync())`,
or, when the trainer publishes ZeRO-3 partitions (`trainer.publish`), `ReshardReader.read_whole` into the
same tensors (each shard lands in place at its flat range; docs/resharding.md).
The engine comes from the rollout-engine registry (`rollout.engine`, e.g. `hf`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from rlsync.config import TrainConfig
from rlsync.core.events import FetchEvent, JoinResult, RolloutResult
from rlsync.core.stall import StallClock
from rlsync.hub import errors as E
from rlsync.workers.group import hub_client as _hub_client, process_setup as _process_setup, with_telemetry
from rlsync.hub.reshard_read import ReshardReader
from rlsync.workers.policy import build_policy, special_ids
from rlsync.workers.sharded_publish import reader_layout, shard_of
from rlsync.workers.weight_channels import EngineChannel

log = logging.getLogger(__name__)


@with_telemetry
class RolloutWorker:
    def __init__(self, cfg: TrainConfig, pool: str, index: int, hub_address: str, hub_token: str):
        _process_setup(cfg, f"{pool}-{index}")
        from rlsync.rollout import build_engine

        self.cfg, self.pool = cfg, pool
        self.worker_id = f"{pool}-{index}"
        self.clock = StallClock(self.worker_id, role="rollout", pool=pool)
        torch.manual_seed(cfg.seed * 1000 + index + 1)  # sampling differs per worker
        model, self.task = build_policy(cfg)
        ecfg = dataclasses.replace(cfg.pools[pool].engine)
        if ecfg.max_new_tokens <= 0:
            ecfg.max_new_tokens = getattr(self.task, "response_len", 16)
        pad, eos = special_ids(self.task)
        self.engine = build_engine(cfg.rollout.engine, ecfg, model, pad_token_id=pad, eos_token_id=eos,
                                   model_cfg=cfg.model)
        self.engine.version = -1  # nothing fetched yet: the random init is not a version
        self.hub = _hub_client(cfg, hub_address, hub_token, cfg.pools[pool].location, self.worker_id)
        self.layout = reader_layout(cfg, model)  # None: the trainer publishes whole tensors
        self.reader = ReshardReader(self.hub, cfg.hub.model_name, self.layout) if self.layout else None
        # Engines that stage and apply (vLLM: the hub cannot fetch into its repacked parameters) get the
        # hub client; their updates are fetch-into-staging + in-place apply (docs/vllm.md).
        # (sync.mode object_store / broadcast: weights come from the channel instead, weight_channels.py.)
        self.staged = getattr(self.engine, "stages_weights", False) and cfg.sync.mode == "hub"
        if self.staged:
            self.engine.attach_hub(self.hub, cfg.hub.model_name, layout=self.layout)
        self.channel = EngineChannel(self.engine, self.clock, hub_address, cfg.rollout.weight_poll_s)  # sync.mode != hub

    def set_channel(self, broadcast: tuple, meta: dict) -> str:
        """sync.mode=broadcast: join the static group (host, port, world, rank, timeout_s); blocks until all have."""
        self.channel.connect(broadcast, meta)
        return self.worker_id

    def recv_broadcast(self) -> int:
        """sync.mode=broadcast: take part in the trainer's broadcast of the next version (blocks until all have)."""
        return self.channel.recv()

    def ready(self) -> str:
        return self.worker_id

    def _ensure_weights(self, min_version: int) -> None:
        r, name = self.cfg.rollout, self.cfg.hub.model_name
        if self.cfg.sync.mode == "object_store":
            return self.channel.pull(min_version)
        if self.cfg.sync.mode == "broadcast":  # the driver queued the broadcast ahead of this call
            if self.engine.version < min_version:
                raise RuntimeError(f"broadcast mode: engine holds v{self.engine.version} < {min_version}")
            return
        if self.engine.version >= min_version:
            if not r.eager_fetch:
                return
            latest = self.hub.latest(name)
            if latest is None or latest <= self.engine.version:
                return
        else:
            with self.clock.state("waiting_weights"):
                if self.cfg.inject.weights_delay_s:
                    time.sleep(self.cfg.inject.weights_delay_s)
                while (latest := self.hub.latest(name)) is None or latest < min_version:
                    time.sleep(r.weight_poll_s)
        self._record_fetch(self._fetch_latest(name))

    def _record_fetch(self, got, **extra) -> None:
        self.engine.version = got.version
        if self.staged:  # a SyncStats: the engine's fetch, apply and pause (sync/fetch_s, apply_s, pause_s)
            self.clock.event("engine_update", version=got.version, fetch_s=got.fetch_s, apply_s=got.apply_s,
                             pause_s=got.pause_s, fetch_wait_s=got.fetch_wait_s)
            if not got.bytes_by_source:
                return  # applied a version already fetched and recorded
        ev = FetchEvent.from_result(got, wid=self.hub.worker_id, dc=self.hub.location.dc, **extra)
        self.clock.event(FetchEvent.NAME, **ev.attrs())

    def join_run(self) -> JoinResult:
        """Become useful to a running job: fetch `latest` now (the planner prefers peers near this
        worker over the trainer), before the driver hands out work. Before the first publish: no-op.

        Returns the hub worker id (the driver's map of sources) and what the fetch read from whom.
        """
        name = self.cfg.hub.model_name
        got = latest = None
        if self.cfg.sync.mode == "object_store":  # from the object store (its bytes_by_source is on the fetch event)
            self.channel.pull(0, join=True)
        else:
            try:
                latest = self.hub.latest(name)
            except E.UnknownModelError:  # nothing published yet (the run is starting)
                latest = None
        if latest is not None:
            got = self._fetch_latest(name)
            self._record_fetch(got, join=True)
        self.clock.enter("idle")
        return JoinResult(worker=self.worker_id, wid=self.hub.worker_id, pool=self.pool, dc=self.hub.location.dc,
                          version=self.engine.version, bytes_by_source=dict(got.bytes_by_source) if got else {})

    def _fetch_latest(self, name: str, attempts: int = 8):
        """Fetch `latest` into the engine's parameters; retry when the version resolved is lost meanwhile.

        Race: `latest` resolves to v, then v + 1 commits and every holder of v lets it go (the
        trainer steps, peers fetch v + 1 into the same buffers) before this read is served. v is
        then no longer retained and the hub says so (VersionLostError); `latest` is now v + 1.
        A retry overwrites every buffer, so a half-written v never survives.
        """
        for attempt in range(attempts):
            try:
                with self.clock.state("loading_weights"):
                    if self.staged:
                        return self.engine.update_latest()
                    if self.cfg.sync.deltas and self.engine.version >= 0:  # the held version stays until v is built
                        return self.hub.fetch_delta(name, "latest", into=self.engine.named_parameters_for_sync(),
                                                    fallback=True)
                    self._release_held(name)
                    if self.reader is not None:
                        return self.reader.read_whole("latest", into=self.engine.named_parameters_for_sync())
                    return self.hub.fetch(name, "latest", into=self.engine.named_parameters_for_sync())
            except (E.VersionLostError, E.VersionNotRetainedError, E.TransferError) as e:
                self.engine.version = -1  # the buffers may hold a mix now
                self.clock.event("fetch_retry", error=type(e).__name__)
                log.info("fetch of latest %s failed (%s); retrying (%d/%d)", name, e, attempt + 1, attempts)
                with self.clock.state("waiting_weights"):
                    time.sleep(min(2.0, 0.05 * 2 ** attempt))
        raise RuntimeError(f"could not fetch {name!r} latest in {attempts} attempts")

    def _release_held(self, name: str) -> None:
        """Release the version our buffers hold before asking for the next one (a hub race, docs/rl.md).

        The hub advertises this worker as a relay of the new version the moment it plans the fetch,
        but our data server holds that relay only after the plan is back and the old version in the
        same buffers is released (which waits for its readers to drain). A reader planned on us in
        between is refused, marks us suspect and re-plans, across the DC link when we are its only
        in-DC source. Releasing first shrinks that window to one RPC reply.
        """
        for rid in self.hub.held_ids():
            if rid.model == name and rid.slot == "live":
                self.hub.release(name, rid.version, shard_of(self.layout, rid.shard))

    def rollout(self, prompts: list, min_version: int) -> RolloutResult:
        """Sample `group_size` responses per prompt with weights of version >= min_version, score them.

        Returns one trainer `Batch` per prompt group (data, never weights) and the version they came from.
        """
        g = self.cfg.rollout.group_size
        if self.staged:
            with self.clock.state("loading_weights"):
                staged = self.engine.apply_staged()      # a prefetched newer version: the only pause
            if staged is not None:
                self._record_fetch(staged)
        self._ensure_weights(min_version)
        if self.staged:
            self.engine.prefetch_latest()                # fetch what is newer while this batch generates
        t0 = time.perf_counter()
        with self.clock.state("generating"):
            out = self.engine.generate([p.prompt_ids for p in prompts for _ in range(g)])
            rewards = torch.tensor([self.task.score(prompts[i // g], r) for i, r in enumerate(out.response_ids)],
                                   dtype=torch.float32)
            group_ids = torch.tensor([p.index for p in prompts]).repeat_interleave(g)
            batch = out.to_batch(rewards, group_ids)
            if self.cfg.inject.generate_delay_s:
                time.sleep(self.cfg.inject.generate_delay_s)
        self.clock.enter("idle")
        groups = [batch.select(torch.arange(i * g, (i + 1) * g)) for i in range(len(prompts))]
        return RolloutResult(worker=self.worker_id, version=out.version, groups=groups,
                             generate_s=time.perf_counter() - t0)

    def evaluate(self, prompts: list, min_version: int) -> dict[str, float]:
        """Greedy decoding of held-out prompts with weights of version >= min_version: mean reward, share fully right."""
        self._ensure_weights(min_version)
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
        if self.staged:
            self.engine.close()  # stop prefetching first
        self.hub.leave(deadline_s=deadline_s)

