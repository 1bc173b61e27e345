"""Worker actors of the RL loop: trainer ranks and rollout workers, plus `WorkerGroup`, their lifecycle.

Plain classes (testable without Ray); `WorkerGroup` turns them into Ray actors. Every worker owns a
`StallClock` and answers `drain_stall()` from a separate concurrency group, so the driver can cut a
step window while the worker is busy. Weights never travel in a call's arguments or results: the
trainer publishes its live tensors to the hub, and rollout workers fetch into their engine's
parameter tensors (`hub.fetch(..., into=engine.named_parameters_for_sync())`).

    TrainerWorker: __init__ (builds model + backend, joins the process group; rank 0 joins the hub)
                   publish() -> {version, bytes}; train(batch) -> metrics (release, step, publish);
                   save_checkpoint(dir); load_checkpoint(dir) -> version
    RolloutWorker: rollout(prompts, min_version) -> {groups, version, ...}: fetches `latest` first
                   when its weights are older than min_version (waiting_weights, loading_weights),
                   then generates and scores (generating)

Simplifies: rank 0 publishes the whole model as one shard (`Shard()`); under ZeRO-3 every rank
all-gathers (a collective) and rank 0 publishes the gathered copy.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable

import ray
import torch

from rlsync.config import TrainConfig
from rlsync.stall import StallClock

log = logging.getLogger(__name__)

WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
              # DeepSpeed's compiled op is cached here (scripts/run's default too): never rebuild it per run.
              "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                     os.path.expanduser("~/.cache/torch_extensions"))}


# ---------------------------------------------------------------------------------- shared set-up

def build_task(cfg: TrainConfig, tokenizer: Any = None):
    """The run's task (its own tokenizer for the symbol tasks; the model's for arithmetic)."""
    from rlsync.rollout import build_task as _build

    return _build(cfg.task.name, tokenizer, seed=cfg.task.seed, **dict(cfg.task.args))


def build_policy(cfg: TrainConfig, *, tokenizer_only: bool = False):
    """(model or None, task) as every process of the run builds them: same seed, same weights."""
    if cfg.model.kind == "tiny":
        from rlsync.rollout import build_tiny_model

        task = build_task(cfg)
        if tokenizer_only:
            return None, task
        tok = task.tokenizer
        model = build_tiny_model(dataclasses.replace(cfg.model.tiny, seed=cfg.seed), tok.vocab_size,
                                 pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                 eos_token_id=tok.eos_token_id)
        return model, task
    if cfg.model.kind == "smollm2":
        from rlsync.rollout import load_smollm2

        if tokenizer_only and cfg.model.cache_dir and os.path.exists(os.path.join(cfg.model.cache_dir, "config.json")):
            import transformers

            return None, build_task(cfg, transformers.AutoTokenizer.from_pretrained(cfg.model.cache_dir))
        model, tok = load_smollm2(cache_dir=cfg.model.cache_dir)
        return (None if tokenizer_only else model), build_task(cfg, tok)
    raise ValueError(f"unknown model.kind {cfg.model.kind!r}; known: tiny, smollm2")


def special_ids(task) -> tuple[int, int]:
    tok = task.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return pad, tok.eos_token_id


def _process_setup(cfg: TrainConfig) -> None:
    from rlsync.logs import setup_logging

    os.environ.update(WORKER_ENV)
    setup_logging()
    torch.set_num_threads(max(1, cfg.ray.torch_threads))


def _hub_client(cfg: TrainConfig, address: str, token: str, location, name: str):
    from rlsync.hub import ClientConfig, HubClient, Location

    hub = HubClient(address, token=token, config=ClientConfig(transport=cfg.hub.transport))
    hub.join(Location(dc=location.dc, rack=location.rack, host=location.host), name=name)
    return hub


def _telemetry(cls):
    """Give a worker class the `drain_stall` method every worker exposes."""

    def drain_stall(self) -> list:
        """Closed state intervals and events since the last drain (the open interval is cut at now)."""
        return self.clock.drain()

    cls.drain_stall = drain_stall
    return cls


# ---------------------------------------------------------------------------------- trainer rank

@_telemetry
class TrainerWorker:
    def __init__(self, cfg: TrainConfig, rank: int, master_port: int | None, hub_address: str, hub_token: str):
        """Rank `rank` of the initial group at `master_port`; `master_port=None`: a worker added to an
        elastic group mid-run, alone until `reform` takes it in (`rank` is then its actor index)."""
        _process_setup(cfg)
        from rlsync.trainer import DeepSpeedBackend, DistConfig, TorchBackend, free_port

        self.cfg, self.rank = cfg, rank
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
        algo = {f.name: getattr(t.algo, f.name) for f in dataclasses.fields(t.algo)}
        if t.backend == "torch":
            self.backend = TorchBackend(TorchBackend.Config(**algo, dist=dist), model)
        elif t.backend == "deepspeed":
            self.backend = DeepSpeedBackend(DeepSpeedBackend.Config(
                **algo, dist=dist, zero_stage=t.zero_stage, extra_ds_config=dict(t.extra_ds_config)), model)
        else:
            raise ValueError(f"unknown trainer.backend {t.backend!r}; known: torch, deepspeed")
        # Elastic: every rank joins the hub, since after a re-form each one fetches the weights.
        self.hub = (_hub_client(cfg, hub_address, hub_token, t.location, self.worker_id)
                    if self.rank == 0 or elastic else None)
        self.published: int | None = None
        self._backup: dict[str, torch.Tensor] | None = None  # rank 1's hub replica of the last publish
        self._backup_version: int | None = None

    def ready(self) -> dict:
        """Parameter names and shapes (metadata only: the driver's no-weights-through-Ray audit)."""
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
            r = self.hub.fetch(name, "latest", into=into)
            got.update(version=r.version, bytes_by_source=dict(r.bytes_by_source), seconds=r.seconds,
                       digest=weights_digest(into))
            self.hub.release(name, r.version)  # never written while a replica: give it back first
            return r.version

        with self.clock.state("loading_weights"):
            dist = DistConfig(world_size=world_size, rank=rank, master_port=master_port,
                              timeout_s=e.collective_timeout_s)
            version = self.backend.reform(dist, load_weights, lambda: build_policy(self.cfg)[0])
        self.clock.event("fetch", version=version, bytes=sum(got["bytes_by_source"].values()),
                         seconds=got["seconds"], sources=sorted(got["bytes_by_source"]), recover=True)
        opt = "reinit"
        if e.optimizer_state == "checkpoint" and optimizer_from and self.backend.load_optimizer_state(optimizer_from):
            opt = "checkpoint"
        elif self.cfg.trainer.backend == "torch":
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
        """Register the current weights in the hub as version `backend.version` (no copy)."""
        tensors = self.backend.named_parameters_for_sync()  # a collective under ZeRO-3: every rank calls
        v = self.backend.version
        nbytes = _nbytes(tensors)
        self._sync_meta = {n: (tuple(x.shape), x.dtype) for n, x in tensors.items()}
        out = {"version": v, "bytes": nbytes}
        if self.rank == 0:
            self.hub.publish(self.cfg.hub.model_name, v, {k: x.contiguous() for k, x in tensors.items()})
            self.published = v
            self.clock.event("publish", version=v, bytes=nbytes)
            if self.cfg.trainer.elastic.enabled:  # what a recovery must reproduce bit for bit (docs/elastic.md)
                out["digest"] = weights_digest(tensors)
        self.clock.enter("waiting_data")
        return out

    def release(self) -> None:
        """Give the published version back before the optimizer writes the tensors (mutability contract)."""
        if self.hub is not None and self.published is not None:
            with self.clock.state("releasing"):
                self.hub.release(self.cfg.hub.model_name, self.published)
            self.published = None

    def train(self, batch) -> dict[str, float]:
        """Release the published version, take one step on this rank's share, publish the new version."""
        self.release()
        with self.clock.state("training"):
            m = self.backend.train_step(batch)
            pub = self.publish()
        m["version"] = pub["version"]
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


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(x.numel() * x.element_size() for x in tensors.values())


def weights_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes, in name order: equal iff bit-for-bit equal."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# ---------------------------------------------------------------------------------- rollout worker

@_telemetry
class RolloutWorker:
    def __init__(self, cfg: TrainConfig, pool: str, index: int, hub_address: str, hub_token: str):
        _process_setup(cfg)
        from rlsync.rollout import RolloutEngine

        self.cfg, self.pool = cfg, pool
        self.worker_id = f"{pool}-{index}"
        self.clock = StallClock(self.worker_id, role="rollout", pool=pool)
        torch.manual_seed(cfg.seed * 1000 + index + 1)  # sampling differs per worker
        model, self.task = build_policy(cfg)
        ecfg = dataclasses.replace(cfg.pools[pool].engine)
        if ecfg.max_new_tokens <= 0:
            ecfg.max_new_tokens = getattr(self.task, "response_len", 16)
        pad, eos = special_ids(self.task)
        self.engine = RolloutEngine(ecfg, model, pad_token_id=pad, eos_token_id=eos)
        self.engine.version = -1  # nothing fetched yet: the random init is not a version
        self.hub = _hub_client(cfg, hub_address, hub_token, cfg.pools[pool].location, self.worker_id)

    def ready(self) -> str:
        return self.worker_id

    def _ensure_weights(self, min_version: int) -> None:
        r, name = self.cfg.rollout, self.cfg.hub.model_name
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
        self.clock.event("fetch", version=got.version, bytes=got.nbytes, seconds=got.seconds,
                         sources=sorted(got.bytes_by_source), transports=sorted(set(got.transports.values())),
                         bytes_by_source=dict(got.bytes_by_source), wid=self.hub.worker_id, dc=self.hub.location.dc,
                         **extra)

    def join_run(self) -> dict[str, Any]:
        """Become useful to a running job: fetch `latest` now (the planner prefers peers near this
        worker over the trainer), before the driver hands out work. Before the first publish: no-op.

        Returns the hub worker id (the driver's map of sources) and what the fetch read from whom.
        """
        from rlsync.hub import errors as E

        name = self.cfg.hub.model_name
        got = None
        try:
            latest = self.hub.latest(name)
        except E.UnknownModelError:  # nothing published yet (the run is starting)
            latest = None
        if latest is not None:
            got = self._fetch_latest(name)
            self._record_fetch(got, join=True)
        self.clock.enter("idle")
        return {"worker": self.worker_id, "wid": self.hub.worker_id, "pool": self.pool,
                "dc": self.hub.location.dc, "version": self.engine.version,
                "bytes_by_source": dict(got.bytes_by_source) if got else {}}

    def _fetch_latest(self, name: str, attempts: int = 8):
        """Fetch `latest` into the engine's parameters; retry when the version resolved is lost meanwhile.

        Race: `latest` resolves to v, then v + 1 commits and every holder of v lets it go (the
        trainer steps, peers fetch v + 1 into the same buffers) before this read is served. v is
        then no longer retained and the hub says so (VersionLostError); `latest` is now v + 1.
        A retry overwrites every buffer, so a half-written v never survives.
        """
        from rlsync.hub import errors as E

        for attempt in range(attempts):
            try:
                with self.clock.state("loading_weights"):
                    self._release_held(name)
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
        for rid in self.hub.held():
            _, model, version, _, slot = rid.split(":")
            if model == name and slot == "live":
                self.hub.release(name, int(version))

    def rollout(self, prompts: list, min_version: int) -> dict[str, Any]:
        """Sample `group_size` responses per prompt with weights of version >= min_version, score them.

        Returns metadata and one trainer `Batch` per prompt group (data, never weights).
        """
        g = self.cfg.rollout.group_size
        self._ensure_weights(min_version)
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
        return {"worker": self.worker_id, "version": out.version, "groups": groups,
                "generate_s": time.perf_counter() - t0}

    def shutdown(self, deadline_s: float = 0.0) -> None:
        """Leave the hub; with `deadline_s` > 0 (a preemption notice) retention hands off what only we hold."""
        self.hub.leave(deadline_s=deadline_s)


# ---------------------------------------------------------------------------------- worker group

class WorkerGroup:
    """A named set of Ray actors of one worker class with a common lifecycle: start, add, remove, kill.

        group = WorkerGroup("main", RolloutWorker, lambda i: (cfg, "main", i, addr, token), num_cpus=0.5)
        group.start(2); group.members            # {"main-0": handle, "main-1": handle}
        group.remove("main-1")                   # graceful: leaves the hub, then the actor ends
        group.kill("main-0")                     # no notice (what a spot preemption looks like)

    Actor creation is asynchronous: `start`/`add` return at once; `wait_ready` blocks with a timeout.
    """

    def __init__(self, name: str, worker_cls: type, make_args: Callable[[int], tuple], *,
                 num_cpus: float = 0.5, env: dict[str, str] | None = None, first_index: int = 0):
        self.name, self.make_args = name, make_args
        self._actor = ray.remote(concurrency_groups={"telemetry": 1})(worker_cls)
        self._opts = dict(num_cpus=num_cpus, max_restarts=0, max_concurrency=1,
                          runtime_env={"env_vars": {**WORKER_ENV, **(env or {})}})
        self.members: dict[str, Any] = {}
        self._next = first_index

    def add(self, *, namespace: str | None = None, detached: bool = False) -> str:
        """Start one more actor; with `namespace` it is named `<key>` there (and `detached` outlives its creator)."""
        i = self._next
        self._next += 1
        key = f"{self.name}-{i}"
        named = dict(name=key, namespace=namespace) if namespace else dict(name=None)
        if detached:
            named["lifetime"] = "detached"
        self.members[key] = self._actor.options(**named, **self._opts).remote(*self.make_args(i))
        return key

    def adopt(self, key: str, handle: Any) -> None:
        """Take over an actor someone else started (a pool attached by `python -m rlsync.pool join`)."""
        self.members[key] = handle
        self._next = max(self._next, int(key.rsplit("-", 1)[1]) + 1) if key.rsplit("-", 1)[-1].isdigit() else self._next

    def start(self, n: int) -> list[str]:
        return [self.add() for _ in range(n)]

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        keys = list(self.members)
        return dict(zip(keys, ray.get([self.members[k].ready.remote() for k in keys], timeout=timeout_s)))

    def drain_refs(self) -> dict[str, Any]:
        return {k: h.drain_stall.options(concurrency_group="telemetry").remote() for k, h in self.members.items()}

    def remove(self, key: str, timeout_s: float = 10.0) -> None:
        """Graceful: the worker leaves the hub (runs retention), then the actor is ended."""
        h = self.members.pop(key)
        try:
            ray.get(h.shutdown.remote(), timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - a dead or stuck worker is killed anyway
            log.warning("worker %s did not shut down cleanly: %s", key, e)
        ray.kill(h, no_restart=True)

    def kill(self, key: str) -> None:
        """Without notice: the hub notices by heartbeat timeout."""
        ray.kill(self.members.pop(key), no_restart=True)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        for key in list(self.members):
            self.remove(key, timeout_s)
