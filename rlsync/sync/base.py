"""The weights' path: the two sides of a route, the driver's part, the route registry and the run's choice.

A route is how a version gets from the trainer ranks into every rollout engine. Each is one file that
registers a `WeightSync` (hub_full.py, hub_delta.py, hub_sharded.py, object_store.py, broadcast.py);
the run's `sync` section (plus what `RunShape` says of the rest of the run) picks one. The workers
and the driver call only this seam:

    route = choose_route(cfg.sync, shape)           # e.g. HubFull
    side = Side(sync=cfg.sync, model="policy", hub=hub, clock=clock, hub_address=addr, shape=shape)
    pub = route.publisher(side, rank)               # a trainer rank
    pub.publish(backend)        # backend.version into the route (hub: its live tensors, no copy)
    pub.release()               # before the optimizer writes those tensors (the mutability contract)
    rcv = route.receiver(side, engine, params=model)   # a rollout worker's engine
    rcv.ensure(min_version)     # returns once the engine holds >= min_version (hub: one parked wait_latest)
    rcv.prefetch()              # fetch what is newer while the engine generates (engines that stage)
    drv = route.coordinator(cfg.sync, addr, timeout_s)  # the driver's part (object store board, broadcast group)

Adding a route (LoRA-only sync, an fp8 variant) is one new file: a `WeightSync` subclass with
`@register_weight_sync("name")`, imported by rlsync/sync/__init__.py (docs/architecture.md, "to add").
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from rlsync.core.registry import Registry

from .engine import caps_of
from .verify import VerifyConfig


@dataclass(kw_only=True)
class SyncConfig:
    mode: str = "hub"
    """How weights reach the engines: `hub` (rlsync), `object_store` (trainer ray.put, each engine pulls and
    reloads: the verl/OpenRLHF shape) or `broadcast` (one static gloo group, all engines block: NCCL's shape).
    `hub` serves whole versions, deltas (`deltas`) or ZeRO-3 shards (`trainer.publish`): rlsync/sync/."""
    broadcast_timeout_s: float = 900.0
    """broadcast: longest a member waits in the collective (the slowest engine's batch included)."""
    deltas: bool = False
    """hub: the trainer also publishes each version's delta from the previous one (hub `publish_delta`:
    one host copy of the weights, an encode per step), and an engine that holds the previous version
    takes the chain of deltas when the hub says it is cheaper than the full version (docs/deltas.md)."""
    wait_s: float = 30.0
    """hub: longest one `wait_latest` call stays parked at the hub while an engine waits for the version
    its request needs (then it asks again; at most 600). The hub answers the moment that version commits."""
    board_poll_s: float = 0.005
    """object_store: how often an engine waiting for a version asks the run's RefBoard actor."""
    inflight: bool = False
    """hub: in-flight updates. Each version is staged the moment it commits while the engine generates, and
    the engine switches to it at a decode-step boundary without draining (engines with `EngineCaps.inflight`:
    vllm, hf); samples may then span versions (`Rollout.token_versions`). docs/rl.md, "In-flight updates"."""
    variant: str = "none"
    """hub: engines read this derived variant of each version instead of the version as published: `bf16` (a cast)
    or `int8` (W8A8 per-row), rlsync/core/transforms.py. The first engine to need it derives and publishes it,
    the others read it from peers; `none`: the version as published (docs/derived.md). With `trainer.lora`: the base's
    variant (`bf16` only), the adapters as published (docs/lora.md)."""
    variant_by: str = "engine"
    """sync.variant: who derives each version's variant: `engine` (the first engine to need it: it takes the
    version itself once) or `trainer` (rank 0, right after publishing, from its live tensors: every engine then
    takes only the variant's bytes; the trainer holds one more copy, in the variant's dtypes)."""
    max_adapters: int = 8
    """hub_adapter (trainer.lora): adapters (tenants x revisions) an engine keeps resident over its base; the least
    recently used one beyond this is evicted (its replica released; a later request fetches it again)."""
    merge_adapter: bool = False
    """hub_adapter: the engine samples with the adapter merged into a copy of the weights it adapts (made once per
    adapter revision; the base replica untouched): plain-model forwards for one live adapter (grpo_lora), at the
    adapted layers' bytes in memory. False: peft's unmerged LoRA branch per layer (many tenants, docs/lora.md)."""
    kv_policy: str = "keep"
    """inflight: what requests in flight do at a switch: `keep` (continue on the KV cache the old weights
    computed, PipelineRL; free) or `recompute` (prefill each in-flight sequence again under the new weights)."""
    stage_nice: int = 20
    """inflight: the nice value of the thread that stages each version (its fetch, conversion and kernel build,
    and the threads it starts): 20 is SCHED_IDLE (it runs only on a core generation leaves idle), 1-19 a nice,
    0 generation's own priority. docs/rl.md, "sync.stage_nice"."""
    stage_escalate_s: float = 10.0
    """inflight, stage_nice 20: an idle staging is raised to nice 10 once it has run this long, or at once when
    the engine waits for that version (a core that is never idle would starve it); 0 never raises it."""
    verify: VerifyConfig = dataclasses.field(default_factory=VerifyConfig)
    """hub routes: what each engine computes with, checked after every apply (docs/verify.md)."""


class SyncModeError(ValueError):
    """A `sync` section the run cannot use: an unknown mode, or a route that does not fit the run (`key`
    names the setting to change: `sync.mode` or `trainer.publish`)."""

    def __init__(self, message: str, key: str = "sync.mode"):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, kw_only=True)
class RunShape:
    """What choosing a route needs to know of the run beyond its `sync` section (`rlsync.config.compose.sync_shape`)."""

    backend: str = "torch"
    zero_stage: int = 0
    publish: str = "auto"
    """trainer.publish: `auto`, `gathered` or `sharded`."""
    trainer_world_size: int = 1
    elastic_trainer: bool = False
    seed_dcs: bool = False
    moving_pools: tuple[str, ...] = ()
    """Pools whose size can change mid-run (policy != fixed)."""
    rollout_engine: str = "hf"
    """rollout.engine: the registered engine the rollout workers build (a variant in its own layout needs one
    that can start in it: `vllm` for `int8`)."""
    lora_rank: int = 0
    """trainer.lora.rank: > 0, each version is a LoRA adapter over a base published once (hub_adapter.py)."""
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ()

    def lora(self):
        """The run's `LoraConfig` (rank 0: off)."""
        from rlsync.core.lora import LoraConfig

        return LoraConfig(rank=self.lora_rank, alpha=self.lora_alpha, target_modules=list(self.lora_targets))


@dataclass(kw_only=True)
class Side:
    """What one side of a route is built with (never the whole run config)."""

    sync: SyncConfig
    model: str
    """The hub's model name."""
    hub: Any
    """This worker's joined `HubClient` (None: a trainer rank that does not join)."""
    clock: Any
    """This worker's `StallClock`: the route records its states and events there."""
    hub_address: str
    shape: RunShape = dataclasses.field(default_factory=RunShape)


class WeightPublisher(ABC):
    """A trainer rank's side: publish each version, release it before the optimizer step, and (an elastic
    group re-forming, docs/elastic.md) take the latest committed version back from the hub's replicas."""

    all_ranks_join: ClassVar[bool] = False
    """Every rank publishes (its shard), so every rank needs a hub client; else rank 0 publishes."""

    def __init__(self, side: Side, rank: int, *, digest: bool = False):
        """`digest`: publish also returns the weights' digest (what an elastic recovery must reproduce)."""
        from rlsync.hub import Shard

        self.side, self.rank, self.digest = side, rank, digest
        self.hub, self.clock, self.model = side.hub, side.clock, side.model
        self.published: int | None = None
        """The version this rank's live tensors are registered as in the hub (released before the step)."""
        self.shard = Shard()
        """The shard this rank publishes (the whole model unless the route shards)."""
        self.meta: dict[str, tuple] = {}
        """name -> (shape, dtype) of the last version published (what a backup replica is made of)."""
        self.recovered: dict = {}
        self._backup: dict | None = None  # rank 1's hub replica of the last publish (elastic)
        self._backup_version: int | None = None

    @abstractmethod
    def publish(self, backend: Any) -> dict:
        """Make `backend.version` reach the engines; returns {"version", "bytes"} (+ "digest" when asked)."""

    def _whole(self, backend: Any) -> tuple[int, dict, int]:
        """(version, name -> tensor of the whole model, its bytes) for the routes that send whole versions: a
        collective under ZeRO-3 (every rank calls). Remembers the shapes (what a backup replica is made of)."""
        from rlsync.core.digest import nbytes

        tensors = backend.named_parameters_for_sync()
        self.meta = {k: (tuple(x.shape), x.dtype) for k, x in tensors.items()}
        return backend.version, tensors, nbytes(tensors)

    def shapes(self, backend: Any) -> dict[str, tuple[int, ...]]:
        """Every parameter's full shape (metadata only: the driver's no-weights-through-Ray audit)."""
        return {n: tuple(p.shape) for n, p in backend.named_parameters_for_sync().items()}

    def release(self) -> None:
        """Give the published version back before the optimizer writes the tensors (mutability contract)."""
        if self.hub is not None and self.published is not None:
            with self.clock.state("releasing"):
                self.hub.release(self.model, self.published, self.shard)
            self.published = None

    def connect(self, backend: Any, arg: Any = None) -> dict:
        """The driver's set-up call (object store, broadcast); returns {name: (shape, dtype name)}."""
        return {n: (tuple(x.shape), str(x.dtype).removeprefix("torch."))
                for n, x in backend.named_parameters_for_sync().items()}

    def push(self) -> dict:
        """The driver's call after each publish (broadcast: send the version); nothing for the others."""
        return {}

    # ---- an elastic group re-forming: whatever the route, the weights come back from the hub's replicas
    def latest(self) -> int | None:
        return self.hub.latest(self.model)

    def recover(self, into: dict) -> int:
        """Load the hub's latest committed version into `into` (a re-formed rank's parameters), release that
        replica (the optimizer will write those tensors), record a `recover` fetch event; its version.
        `self.recovered`: {version, bytes_by_source, seconds, digest}."""
        import time

        from rlsync.core.digest import nbytes, weights_digest
        from rlsync.core.events import FetchEvent

        latest = self.hub.latest(self.model)
        if latest is not None and latest == self._backup_version:
            # This rank holds `latest` already, as its backup replica (fetched through the hub at publish
            # time): copy it, since a worker cannot hold two replicas of one version.
            t = time.perf_counter()
            for n, x in into.items():
                x.copy_(self._backup[n])
            got = dict(version=latest, bytes_by_source={self.hub.worker_id: nbytes(into)},
                       seconds=time.perf_counter() - t)
        else:
            # The committed latest by number: 'latest' would fall back to an older held version if
            # every holder of the newest died, and a trainer must not silently step back.
            r = self.hub.fetch(self.model, latest if latest is not None else "latest", into=into)
            got = dict(version=r.version, bytes_by_source=dict(r.bytes_by_source), seconds=r.seconds)
            self.hub.release(self.model, r.version)  # never written while a replica: give it back first
        self.recovered = dict(got, digest=weights_digest(into))
        by = got["bytes_by_source"]
        ev = FetchEvent(version=got["version"], bytes=sum(by.values()), seconds=got["seconds"], sources=tuple(sorted(by)),
                        bytes_by_source=dict(by), wid=self.hub.worker_id, dc=self.hub.location.dc, recover=True)
        self.clock.event(FetchEvent.NAME, **ev.attrs())
        return got["version"]

    def keep_backup(self, version: int, hold: bool) -> None:
        """`hold`: fetch `version` (just committed) into this rank's backup buffers, which releases the
        previous one; else drop any backup this rank still holds."""
        import torch

        if hold:
            if self._backup is None:
                self._backup = {n: torch.empty(s, dtype=d) for n, (s, d) in self.meta.items()}
            self.hub.fetch(self.model, version, into=self._backup)
            self._backup_version = version
        elif self._backup_version is not None:
            self.hub.release(self.model, self._backup_version)
            self._backup = self._backup_version = None


class WeightReceiver(ABC):
    """A rollout engine's side: make the engine hold a version >= min_version, and fetch ahead."""

    def __init__(self, side: Side, engine: Any, *, params: Any = None, delay_s: float = 0.0):
        """`params`: the worker's own copy of the model (names, shapes, dtypes: a sharded reader's layout);
        `delay_s`: a known sleep in `waiting_weights` before each wait (tests of the stall metrics)."""
        self.side, self.sync, self.hub, self.model, self.clock = side, side.sync, side.hub, side.model, side.clock
        self.engine, self.caps = engine, caps_of(engine)
        self.delay_s = delay_s

    @property
    def version(self) -> int:
        return self.engine.version

    @abstractmethod
    def ensure(self, min_version: int, eager: bool = False) -> None:
        """Return once the engine holds a version >= min_version; `eager`: also take a newer one if there is."""

    @abstractmethod
    def join(self) -> dict[str, int]:
        """A worker joining a running job takes the latest version now; returns bytes by source ({}: none yet)."""

    def prefetch(self) -> None:
        """Start fetching what is newer while the engine generates (engines that stage); else nothing."""

    def verify_generated(self) -> set[int]:
        """After a `generate`: check versions switched in during it (in flight); the versions that failed a
        check since the last call (their samples must not be trained: the driver drops them). docs/verify.md."""
        return set()

    def connect(self, arg: Any, meta: dict) -> None:
        raise TypeError(f"{type(self).__name__}: this route has no driver set-up")

    def push(self) -> int:
        raise TypeError(f"{type(self).__name__}: this route takes no pushed versions")

    def close(self) -> None:
        """Stop any background fetching (before the worker leaves the hub)."""


class SyncCoordinator:
    """The driver's part of a route: nothing for the hub routes (weights never pass the driver).

        drv.start(trainers, pools, timeout_s)   # after every worker is ready
        drv.after_publish(wait=False)           # after each step's publish
        drv.may_start(min_version, published)   # whether a request for min_version may go out now
        drv.check(timeout_s)                    # errors of what after_publish queued
    """

    def __init__(self, sync: SyncConfig, hub_address: str, timeout_s: float):
        self.sync, self.hub_address, self.timeout_s = sync, hub_address, timeout_s

    def start(self, trainers: Any, pools: Any, timeout_s: float) -> None:
        pass

    def after_publish(self, wait: bool = False) -> None:
        pass

    def check(self, timeout_s: float) -> None:
        pass

    def may_start(self, min_version: int, published: int) -> bool:
        return True


class WeightSync:
    """A registered route: the `sync.mode` it serves, its three parts, and when it fits a run."""

    name: ClassVar[str]
    """Its registry name (set by `register_weight_sync`)."""
    mode: ClassVar[str]
    """The `sync.mode` value this route serves (several routes may serve one mode: `order` picks)."""
    order: ClassVar[int] = 0
    """Among the routes of one mode, the first (lowest) that fits the run is used."""
    shards: ClassVar[bool] = False
    """Each trainer rank publishes its own ZeRO-3 partition (what `trainer.publish=sharded` asks for)."""
    publisher: ClassVar[type[WeightPublisher]]
    receiver: ClassVar[type[WeightReceiver]]
    coordinator: ClassVar[type[SyncCoordinator]] = SyncCoordinator
    adapters: ClassVar[bool] = False
    """Sends LoRA adapters over a base (what `trainer.lora.rank > 0` needs); the others send whole models."""

    @classmethod
    def misfit(cls, sync: SyncConfig, shape: RunShape) -> str | None:
        """Why this route cannot serve the run (None: it can)."""
        return None

    @classmethod
    def engine_variant(cls, sync: SyncConfig) -> str | None:
        """The derived variant whose layout each rollout engine must start in (the worker builds it so), or None."""
        return None


WEIGHT_SYNCS: Registry = Registry("weight-sync route")


def register_weight_sync(name: str):
    """`@register_weight_sync("hub_lora")` on a `WeightSync` subclass: a route, named (`route.name`)."""

    def deco(cls: type[WeightSync]) -> type[WeightSync]:
        cls.name = name
        return WEIGHT_SYNCS.register(name)(cls)

    return deco


def sync_modes() -> list[str]:
    """The `sync.mode` values the registered routes serve."""
    return sorted({WEIGHT_SYNCS.get(n).mode for n in WEIGHT_SYNCS.names()})


def choose_route(sync: SyncConfig, shape: RunShape) -> type[WeightSync]:
    """The route serving this run: among those of `sync.mode`, the first in `order` that fits (with
    `trainer.publish=sharded` it must be one that `shards`; with `gathered`, one that does not).
    SyncModeError names what to change."""
    routes = [WEIGHT_SYNCS.get(n) for n in WEIGHT_SYNCS.names()]
    mine = sorted((r for r in routes if r.mode == sync.mode), key=lambda r: r.order)
    if not mine:
        raise SyncModeError(f"sync.mode: unknown mode {sync.mode!r}; known: {', '.join(sync_modes())}")
    # A LoRA run's versions are adapters: only an adapter route carries them (and adapter routes nothing else).
    mine = [r for r in mine if r.adapters == (shape.lora_rank > 0)]
    if not mine:
        modes = "|".join(sorted({r.mode for r in routes if r.adapters}))
        raise SyncModeError(f"trainer.lora.rank={shape.lora_rank} needs sync.mode={modes} (got {sync.mode}: its "
                            "channel sends whole models)")
    if shape.publish == "sharded":
        sharding = [r for r in mine if r.shards]
        if not sharding:
            modes = "|".join(sorted({r.mode for r in routes if r.shards}))
            raise SyncModeError(f"trainer.publish=sharded needs sync.mode={modes} (got {sync.mode}: its channel "
                                "sends whole tensors)", key="trainer.publish")
        why = sharding[0].misfit(sync, shape)
        if why:
            raise SyncModeError(f"trainer.publish=sharded {why}", key="trainer.publish")
        return sharding[0]
    why = None
    for r in mine:
        if r.shards and shape.publish == "gathered":
            continue
        why = r.misfit(sync, shape)
        if why is None:
            return r
    raise SyncModeError(f"sync.mode={sync.mode} {why}")
