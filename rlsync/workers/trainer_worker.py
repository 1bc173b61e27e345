"""`TrainerWorker`: one trainer rank as a Ray actor — the backend's step, publish to the hub, elastic re-form.

    __init__ (builds model + backend, joins the process group; rank 0 joins the hub)
    publish() -> {version, bytes}; train(batch) -> metrics (release, step, publish);
    save_checkpoint(dir); load_checkpoint(dir) -> version; reform(...) (docs/elastic.md)

How a version leaves this rank is the run's weight-sync route (rlsync/sync/, `self.publisher`): e.g.
under DeepSpeed ZeRO-3 (`trainer.publish`, hub_sharded.py) every rank publishes its own live partition
as a shard of the version, no gather, no copy; by default rank 0 publishes the whole model (hub_full.py;
under ZeRO-3 every rank all-gathers, a collective, first). This file never asks which route it is.

A rank is built from the run's `trainer` section, the policy's `model` and `task` sections and seed (every
rank builds the same weights), the `sync` section with the route's `RunShape`, and the hub's address.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import torch

from rlsync.core.stall import StallClock
from rlsync.hub.errors import HubError
from rlsync.sync import RunShape, Side, SyncConfig, choose_route
from rlsync.workers.elastic import TrainerGroupConfig
from rlsync.workers.policy import ModelConfig, TaskConfig, build_policy
from rlsync.workers.process import (HubAccess, ProcessSetup, hub_client as _hub_client,
                                    process_setup as _process_setup, with_telemetry)

log = logging.getLogger(__name__)


def build_backend(t, dist, model):
    """The trainer backend `t.backend` names (registry `rlsync.trainer.registry.BACKENDS`), configured from
    the run's `trainer` section: the algorithm, the process group, and any field of `t` its Config declares
    (e.g. DeepSpeed's `zero_stage`, `extra_ds_config`)."""
    from rlsync.trainer import get_backend

    cls = get_backend(t.backend)
    names = {f.name for f in dataclasses.fields(cls.Config)}
    algo = {f.name: getattr(t.algo, f.name) for f in dataclasses.fields(t.algo)}
    extra = {f.name: getattr(t, f.name) for f in dataclasses.fields(t) if f.name in names and f.name not in algo}
    extra = {k: (dict(v) if isinstance(v, dict) else v) for k, v in extra.items()}
    return cls(cls.Config(**algo, **extra, dist=dist), model)


@with_telemetry
class TrainerWorker:
    def __init__(self, trainer: TrainerGroupConfig, rank: int, master_port: int | None, *, model: ModelConfig,
                 task: TaskConfig, seed: int, sync: SyncConfig, shape: RunShape, hub: HubAccess, setup: ProcessSetup):
        """Rank `rank` of the initial group at `master_port`; `master_port=None`: a worker added to an
        elastic group mid-run, alone until `reform` takes it in (`rank` is then its actor index)."""
        _process_setup(setup, f"trainer-{rank}")
        from rlsync.trainer import DistConfig, free_port

        self.t, self.rank = trainer, rank
        self._policy = (model, task, seed)  # what a re-formed rank rebuilds its model from
        self.worker_id = f"trainer-{rank}"
        self.clock = StallClock(self.worker_id, role="trainer", pool="trainer")
        params, _ = build_policy(model, task, seed)
        t = trainer
        elastic = t.elastic.enabled
        timeout = t.elastic.collective_timeout_s if elastic else None
        if master_port is None:
            self.rank = -1  # not in the group yet
            dist = DistConfig(world_size=1, rank=0, master_port=free_port(), timeout_s=timeout)
        else:
            dist = DistConfig(world_size=t.world_size, rank=rank, master_port=master_port, timeout_s=timeout)
        self.backend = build_backend(t, dist, params)
        route = choose_route(sync, shape)
        # Elastic: every rank joins the hub, since after a re-form each one fetches the weights; a route
        # whose every rank publishes (its shard, hub_sharded) too.
        self.hub = (_hub_client(hub, t.location, self.worker_id)
                    if self.rank == 0 or elastic or route.publisher.all_ranks_join else None)
        side = Side(sync=sync, model=hub.model, hub=self.hub, clock=self.clock, hub_address=hub.address, shape=shape)
        self.publisher = route.publisher(side, self.rank, digest=elastic)
        self.sync_variant = sync.variant  # named beside the mismatch it annotates on each version

    def ready(self) -> dict:
        """Parameter names and shapes (metadata only: the driver's no-weights-through-Ray audit)."""
        return {"version": self.backend.version, "shapes": self.publisher.shapes(self.backend),
                "hub_id": self.hub.worker_id if self.hub is not None else None}

    def alive(self) -> int:
        """Liveness probe (answered from the telemetry concurrency group, even mid-collective)."""
        return os.getpid()

    def reform(self, rank: int, world_size: int, master_port: int, optimizer_from: str | None) -> dict:
        """Join the re-formed group as `rank` of `world_size`, weights = the hub's latest committed version.

        Every rank fetches `latest` into the backend's parameter tensors (so all agree bit for bit), then
        releases that replica (the optimizer will write those tensors; rollout replicas keep serving it).
        Optimizer state: from `optimizer_from` (a checkpoint dir; optimizer files only) or fresh, with a warning.
        Returns the version, a digest of the weights as loaded, and where the bytes came from.
        """
        from rlsync.trainer import DistConfig

        t0 = time.perf_counter()
        e = self.t.elastic
        self.release()
        self.rank = rank
        self.publisher.rank = rank
        with self.clock.state("loading_weights"):
            dist = DistConfig(world_size=world_size, rank=rank, master_port=master_port,
                              timeout_s=e.collective_timeout_s)
            version = self.backend.reform(dist, self.publisher.recover, lambda: build_policy(*self._policy)[0])
        got = self.publisher.recovered
        opt = "reinit"
        if e.optimizer_state == "checkpoint" and optimizer_from and self.backend.load_optimizer_state(optimizer_from):
            opt = "checkpoint"
        elif self.backend.can_reset_optimizer:
            self.backend.reset_optimizer()
        if opt == "reinit":
            log.warning("trainer %s: optimizer state re-initialized after re-forming at version %d (%s)",
                        self.worker_id, version, "elastic.optimizer_state=reinit" if e.optimizer_state == "reinit"
                        else f"no usable optimizer state in {optimizer_from!r}")
        self.clock.enter("waiting_data")
        return {"worker": self.worker_id, "rank": rank, "version": version, "digest": got["digest"],
                "bytes_by_source": got["bytes_by_source"], "optimizer": opt,
                "latest": self.publisher.latest(), "seconds": time.perf_counter() - t0}

    def publish(self) -> dict:
        """Make the current weights version `backend.version` reach the engines, the run's route's way
        (hub: register them, no copy; object store: one copy; broadcast: kept for `sync_push`)."""
        out = self.publisher.publish(self.backend)
        self.clock.enter("waiting_data")
        return out

    def sync_connect(self, arg=None) -> dict:
        """The driver's set-up of the route (object store: find the board; broadcast: `arg` = (host, port,
        world_size) of the static group). Returns {name: (shape, dtype name)}."""
        return self.publisher.connect(self.backend, arg)

    def sync_push(self) -> dict:
        """The driver's call after each publish (broadcast, rank 0: send the version to every engine)."""
        return self.publisher.push()

    def release(self) -> None:
        """Give the published version back before the optimizer writes the tensors (mutability contract)."""
        self.publisher.release()

    def train(self, batch) -> dict[str, float]:
        """Release the published version, take one step on this rank's share, publish the new version."""
        self.release()
        sampled_with = self.backend.version  # the version this step's fresh samples were generated with
        with self.clock.state("training"):
            m = self.backend.train_step(batch)
            pub = self.publish()
        m["version"] = pub["version"]
        self._annotate_mismatch(sampled_with, m)
        # bytes of full-model copies this rank gathered for syncing so far (ZeRO-3 gathered publish; 0 sharded)
        m["sync/trainer_gathered_bytes"] = float(getattr(self.backend, "gathered_bytes", 0))
        if "digest" in pub:
            m["digest"] = pub["digest"]
        if self.t.elastic.enabled:
            with self.clock.state("loading_weights"):
                self._keep_backup(pub["version"])
        return m

    def _annotate_mismatch(self, version: int, m: dict) -> None:
        """Sampler-vs-trainer mismatch of `version`'s samples on the version's hub record (docs/derived.md):
        what a variant (bf16, int8) costs learning, beside the version it was derived from."""
        vals = {k.removeprefix("mismatch/"): m[k] for k in ("mismatch/k3", "mismatch/is_clip_frac", "logprob_gap")
                if k in m and m[k] == m[k]}  # NaN: no fresh sample this step
        if self.hub is None or self.rank != 0 or not vals or version < 1:
            return
        try:
            self.hub.annotate(self.publisher.model, version, "mismatch", vals | {"variant": self.sync_variant})
        except HubError as e:  # telemetry: never fails a step (the version may be forgotten already)
            log.info("mismatch of %s v%d not annotated: %s", self.publisher.model, version, e)

    def _keep_backup(self, version: int) -> None:
        """Rank 1 fetches the version rank 0 just published (after a barrier: it is committed) into its
        backup buffers, which releases the previous one; other ranks drop any backup they still hold."""
        dist = torch.distributed
        on = self.t.elastic.backup_replica and dist.is_initialized() and dist.get_world_size() > 1
        if on:
            dist.barrier()
        self.publisher.keep_backup(version, hold=on and self.rank == 1)

    def save_checkpoint(self, path: str) -> None:
        self.backend.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.release()
        self.backend.load_checkpoint(path)
        return self.backend.version

    def shutdown(self) -> None:
        if self.hub is not None:
            self.hub.leave()

