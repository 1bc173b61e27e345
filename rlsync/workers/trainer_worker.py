"""`TrainerWorker`: one trainer rank as a Ray actor — the backend's step, publish to the hub, elastic re-form.

    __init__ (builds model + backend, joins the process group; rank 0 joins the hub)
    publish() -> {version, bytes}; train(batch) -> metrics (release, step, publish);
    save_checkpoint(dir); load_checkpoint(dir) -> version; reform(...) (docs/elastic.md)

Publish (`trainer.publish`, rlsync.config_rules.sharded_publish): under DeepSpeed ZeRO-3 (no elastic
group) every rank publishes its own live partition as a shard of the version, no gather, no copy; the
version commits when all have (docs/resharding.md). Otherwise rank 0 publishes the whole model as one
shard (`Shard()`); under ZeRO-3 that means every rank all-gathers (a collective) first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import torch

from rlsync.config import TrainConfig
from rlsync.core.digest import nbytes as _nbytes, weights_digest
from rlsync.core.events import FetchEvent
from rlsync.core.stall import StallClock
from rlsync.config_rules import sharded_publish
from rlsync.hub.reshard_read import publish_shard, zero_shard
from rlsync.hub.shard import Shard
from rlsync.workers.sharded_publish import zero3_layout_of
from rlsync.workers.group import hub_client as _hub_client, process_setup as _process_setup, with_telemetry
from rlsync.workers.policy import build_policy

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
    def __init__(self, cfg: TrainConfig, rank: int, master_port: int | None, hub_address: str, hub_token: str):
        """Rank `rank` of the initial group at `master_port`; `master_port=None`: a worker added to an
        elastic group mid-run, alone until `reform` takes it in (`rank` is then its actor index)."""
        _process_setup(cfg, f"trainer-{rank}")
        from rlsync.trainer import DistConfig, free_port

        self.cfg, self.rank = cfg, rank
        self._hub_address = hub_address
        self.worker_id = f"trainer-{rank}"
        self.clock = StallClock(self.worker_id, role="trainer", pool="trainer")
        model, _ = build_policy(cfg)
        t = cfg.trainer
        elastic = t.elastic.enabled
        timeout = t.elastic.collective_timeout_s if elastic else None
        if master_port is None:
            self.rank = -1  # not in the group yet
            dist = DistConfig(world_size=1, rank=0, master_port=free_port(), timeout_s=timeout)
        else:
            dist = DistConfig(world_size=t.world_size, rank=rank, master_port=master_port, timeout_s=timeout)
        self.backend = build_backend(t, dist, model)
        self.sharded = sharded_publish(cfg)
        # Elastic: every rank joins the hub, since after a re-form each one fetches the weights;
        # sharded: every rank publishes its partition.
        self.hub = (_hub_client(cfg, hub_address, hub_token, t.location, self.worker_id)
                    if self.rank == 0 or elastic or self.sharded else None)
        self._shard = Shard()
        self.published: int | None = None
        self._backup: dict[str, torch.Tensor] | None = None  # rank 1's hub replica of the last publish
        self._backup_version: int | None = None

    def ready(self) -> dict:
        """Parameter names and shapes (metadata only: the driver's no-weights-through-Ray audit)."""
        if self.sharded:  # full shapes from the partitions: no gather
            shapes = {n: tuple(s) for n, (_, s) in self.backend.named_partitions_for_sync()[2].items()}
        else:
            shapes = {n: tuple(p.shape) for n, p in self.backend.named_parameters_for_sync().items()}
        return {"version": self.backend.version, "shapes": shapes,
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
        e, name = self.cfg.trainer.elastic, self.cfg.hub.model_name
        self.release()
        self.rank = rank
        got = {}

        def load_weights(into: dict[str, torch.Tensor]) -> int:
            latest = self.hub.latest(name)
            if latest is not None and latest == self._backup_version:
                # This rank holds `latest` already, as its backup replica (fetched through the hub at
                # publish time): copy it, since a worker cannot hold two replicas of one version.
                t = time.perf_counter()
                for n, x in into.items():
                    x.copy_(self._backup[n])
                got.update(version=latest, bytes_by_source={self.hub.worker_id: _nbytes(into)},
                           seconds=time.perf_counter() - t, digest=weights_digest(into))
                return latest
            # The committed latest by number: 'latest' would fall back to an older held version if
            # every holder of the newest died, and a trainer must not silently step back.
            r = self.hub.fetch(name, latest if latest is not None else "latest", into=into)
            got.update(version=r.version, bytes_by_source=dict(r.bytes_by_source), seconds=r.seconds,
                       digest=weights_digest(into))
            self.hub.release(name, r.version)  # never written while a replica: give it back first
            return r.version

        with self.clock.state("loading_weights"):
            dist = DistConfig(world_size=world_size, rank=rank, master_port=master_port,
                              timeout_s=e.collective_timeout_s)
            version = self.backend.reform(dist, load_weights, lambda: build_policy(self.cfg)[0])
        ev = FetchEvent(version=version, bytes=sum(got["bytes_by_source"].values()), seconds=got["seconds"],
                        sources=tuple(sorted(got["bytes_by_source"])), bytes_by_source=dict(got["bytes_by_source"]),
                        wid=self.hub.worker_id, dc=self.hub.location.dc, recover=True)
        self.clock.event(FetchEvent.NAME, **ev.attrs())
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
                "latest": self.hub.latest(name), "seconds": time.perf_counter() - t0}

    def publish(self) -> dict:
        """Register the current weights in the hub as version `backend.version` (no copy); with
        `sync.mode=object_store` put them in Ray's object store, with `broadcast` keep them for the
        driver's `broadcast_weights` call (weight_channels.py). Sharded (`trainer.publish`): every rank
        registers its own live ZeRO-3 partition (`bytes` = this rank's share), no gather."""
        if self.sharded:
            return self._publish_sharded()
        tensors = self.backend.named_parameters_for_sync()  # a collective under ZeRO-3: every rank calls
        v = self.backend.version
        nbytes = _nbytes(tensors)
        self._sync_meta = {n: (tuple(x.shape), x.dtype) for n, x in tensors.items()}
        out = {"version": v, "bytes": nbytes}
        mode = self.cfg.sync.mode
        if self.rank == 0 and mode == "object_store":
            import ray

            with self.clock.state("offloading"):  # gather the state dict, one copy into the object store
                ref = ray.put({k: x.detach().contiguous() for k, x in tensors.items()})
                ray.get(self._board.post.remote(v, [ref]))
            self.clock.event("publish", version=v, bytes=nbytes)
        elif self.rank == 0 and mode == "broadcast":
            self._to_send = (v, tensors)  # live tensors; sent before the next step writes them
            self.clock.event("publish", version=v, bytes=nbytes)
        elif self.rank == 0:
            live = {k: x.contiguous() for k, x in tensors.items()}
            if self.cfg.sync.deltas:  # v's delta from the last version (a copy of it is kept here), committed
                self.hub.publish_delta(self.cfg.hub.model_name, v, live)  # first: an engine seeing v finds it
            self.hub.publish(self.cfg.hub.model_name, v, live)
            self.published = v
            self.clock.event("publish", version=v, bytes=nbytes)
            if self.cfg.trainer.elastic.enabled:  # what a recovery must reproduce bit for bit (docs/elastic.md)
                out["digest"] = weights_digest(tensors)
        self.clock.enter("waiting_data")
        return out

    def _publish_sharded(self) -> dict:
        v = self.backend.version
        rank, layout, live = zero3_layout_of(self.backend)
        nbytes = sum(p.length * live[p.name].element_size() for p in layout.ranks[rank])
        # The checksum pass runs on the client's publish thread while this rank goes on (the next
        # forward/backward only reads the partition); release() waits for it before the step writes.
        publish_shard(self.hub, self.cfg.hub.model_name, v, layout, rank, live, wait=False)
        self._shard, self.published = zero_shard(rank, layout.world), v
        self.clock.event("publish", version=v, bytes=nbytes, shard=rank)
        self.clock.enter("waiting_data")
        return {"version": v, "bytes": nbytes}

    def set_channel(self, broadcast: tuple | None = None) -> dict:
        """sync.mode object_store: find the run's `RefBoard`; broadcast: (host, port, world_size) of the static
        group (rank 0 of it; returns once every engine has joined). Returns {name: (shape, dtype name)}."""
        from rlsync.workers.weight_channels import GlooBroadcast, get_board

        if self.cfg.sync.mode == "object_store":
            self._board = get_board(self._hub_address)
        if broadcast is not None and self.rank == 0:
            host, port, world = broadcast
            self._bcast = GlooBroadcast(host, port, 0, world, self.cfg.sync.broadcast_timeout_s)
        return {n: (tuple(x.shape), str(x.dtype).removeprefix("torch."))
                for n, x in self.backend.named_parameters_for_sync().items()}

    def broadcast_weights(self) -> dict:
        """sync.mode=broadcast, rank 0: send the last published version to every engine (all block)."""
        if self.rank != 0:
            return {}
        v, tensors = self._to_send
        t0 = time.perf_counter()
        with self.clock.state("offloading"):
            self._bcast.rendezvous(v)
            t1 = time.perf_counter()
            self._bcast.tensors(tensors)
        self.clock.enter("waiting_data")
        return {"version": v, "wait_s": t1 - t0, "send_s": time.perf_counter() - t1}

    def release(self) -> None:
        """Give the published version back before the optimizer writes the tensors (mutability contract)."""
        if self.hub is not None and self.published is not None:
            with self.clock.state("releasing"):
                self.hub.release(self.cfg.hub.model_name, self.published, self._shard)
            self.published = None

    def train(self, batch) -> dict[str, float]:
        """Release the published version, take one step on this rank's share, publish the new version."""
        self.release()
        with self.clock.state("training"):
            m = self.backend.train_step(batch)
            pub = self.publish()
        m["version"] = pub["version"]
        # bytes of full-model copies this rank gathered for syncing so far (ZeRO-3 gathered publish; 0 sharded)
        m["sync/trainer_gathered_bytes"] = float(getattr(self.backend, "gathered_bytes", 0))
        if "digest" in pub:
            m["digest"] = pub["digest"]
        if self.cfg.trainer.elastic.enabled:
            with self.clock.state("loading_weights"):
                self._keep_backup(pub["version"])
        return m

    def _keep_backup(self, version: int) -> None:
        """Rank 1 fetches the version rank 0 just published (after a barrier: it is committed) into its
        backup buffers, which releases the previous one; other ranks drop any backup they still hold."""
        name, dist = self.cfg.hub.model_name, torch.distributed
        on = self.cfg.trainer.elastic.backup_replica and dist.is_initialized() and dist.get_world_size() > 1
        if on:
            dist.barrier()
        if on and self.rank == 1:
            if self._backup is None:
                self._backup = {n: torch.empty(s, dtype=d) for n, (s, d) in self._sync_meta.items()}
            self.hub.fetch(name, version, into=self._backup)
            self._backup_version = version
        elif self._backup_version is not None:
            self.hub.release(name, self._backup_version)
            self._backup = self._backup_version = None

    def save_checkpoint(self, path: str) -> None:
        self.backend.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.release()
        self.backend.load_checkpoint(path)
        return self.backend.version

    def shutdown(self) -> None:
        if self.hub is not None:
            self.hub.leave()

