"""How weights reach the rollout engines: the hub (default), or the two shapes users compare it with.

`sync.mode` picks one, in the same run harness (driver loop, workers, metrics):

- `hub` (default): the trainer publishes its live tensors (no copy); each engine fetches `latest` from
  the best replica (trainer or peer engine) when the staleness bound needs it (rollout_worker.py).
- `object_store` (the verl/OpenRLHF shape without a hub): after each step the trainer gathers the
  state dict and `ray.put`s it (one copy into the object store); the ref is posted on a `RefBoard`
  actor; each engine, when it needs that version, `ray.get`s it (a second copy, in its process) and
  reloads its weights from it.
- `broadcast` (NCCL's shape, on gloo here): one static process group of the trainer's rank 0 and every
  engine, made at start. After each step the driver asks the trainer and every engine to take part in
  one broadcast of the whole model; every engine blocks until all have arrived (an engine finishing a
  batch holds up the trainer and all the others), and the group cannot change size (no elastic pools).

Accounting (identical for the three modes, through each worker's stall clock):
- trainer: seconds spent making weights available = `offloading` (object_store: gather + put;
  broadcast: the collective, including the wait for every engine to arrive; hub: none, publish
  registers live tensors) plus `releasing` (hub: the mutability contract's release before the step).
- engines: `waiting_weights` (the version does not exist yet, or the others have not arrived) and
  `loading_weights` (bytes moving and the reload into the engine).
- bytes: a `fetch` event per engine update, `bytes_by_source` = {"object_store": n} or {"broadcast": n}
  (hub fetches name the hub worker ids that served them).
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # torch is imported where it is used: the config schema (SyncConfig) stays torch-free
    import torch

log = logging.getLogger(__name__)

SYNC_MODES = ("hub", "object_store", "broadcast")


@dataclass(kw_only=True)
class SyncConfig:
    mode: str = "hub"
    """How weights reach the engines: `hub` (rlsync), `object_store` (trainer ray.put, each engine pulls and
    reloads: the verl/OpenRLHF shape) or `broadcast` (one static gloo group, all engines block: NCCL's shape)."""
    broadcast_timeout_s: float = 900.0
    """broadcast: longest a member waits in the collective (the slowest engine's batch included)."""
    deltas: bool = False
    """hub: the trainer also publishes each version's delta from the previous one (hub `publish_delta`:
    one host copy of the weights, an encode per step), and an engine that holds the previous version
    takes the chain of deltas when the hub says it is cheaper than the full version (docs/deltas.md)."""


class SyncModeError(ValueError):
    """A `sync.mode` the run cannot use (unknown, or a static-group mode with elastic pools or trainers)."""


def check_sync(cfg) -> None:
    """Refuse an unknown mode, and `broadcast` with any worker that may come or go (its group is static)."""
    mode = cfg.sync.mode
    if mode not in SYNC_MODES:
        raise SyncModeError(f"sync.mode: unknown mode {mode!r}; known: {', '.join(SYNC_MODES)}")
    if mode == "broadcast":
        moving = [n for n, p in cfg.pools.items() if p.policy != "fixed"]
        if moving or cfg.trainer.elastic.enabled:
            raise SyncModeError(f"sync.mode=broadcast needs a static group: pools {moving} are not `fixed`"
                                if moving else "sync.mode=broadcast needs a static group: trainer.elastic is on")


def apply_weights(engine: Any, tensors: Mapping[str, torch.Tensor], version: int) -> None:
    """Reload `tensors` (every parameter, by name) into a rollout engine: HF `load_state` or vLLM's
    `apply` (the same direct apply the hub's stage uses, so the modes differ by transport only);
    either checks the names and refuses a partial update."""
    if hasattr(engine, "load_state"):
        engine.load_state(tensors, version=version)
    else:  # the vllm engine (or the wrapper the RL loop drives, which holds it as `.engine`)
        specs = tuple((n, tuple(t.shape)) for n, t in tensors.items())
        getattr(engine, "engine", engine).apply(iter(tensors.items()), version, expect=list(tensors), specs=specs)


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class RefBoard:
    """A Ray actor holding the object ref of the newest version (object_store mode). Not the weights:
    the trainer owns the object; the board keeps one ref alive, dropping the previous version's."""

    def __init__(self) -> None:
        self.version = -1
        self.refs: list = []

    def post(self, version: int, refs: list) -> None:
        if version > self.version:
            self.version, self.refs = version, refs

    def latest(self) -> tuple[int, list]:
        return self.version, self.refs


def board_name(hub_address: str) -> str:
    """The run's `RefBoard` actor name (one per run: the embedded hub's address is unique per run)."""
    return f"rlsync-refboard-{hub_address}"


def get_board(hub_address: str):
    import ray

    return ray.get_actor(board_name(hub_address))


class GlooBroadcast:
    """One member of the static broadcast group: rank 0 sends, ranks 1..n-1 receive, all block.

    A `TCPStore` + `ProcessGroupGloo` of its own, so it coexists with the trainer's DDP group.
    Each broadcast sends the version first (the rendezvous: every member has arrived when it
    completes), then the tensors one by one in name order."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, timeout_s: float):
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
        self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)
        self.rank, self.world_size = rank, world_size

    def rendezvous(self, version: int) -> int:
        import torch

        v = torch.tensor([version], dtype=torch.long)
        self.pg.broadcast(v, 0).wait()
        return int(v.item())

    def tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        for name in sorted(tensors):
            self.pg.broadcast(tensors[name], 0).wait()


def recv_buffers(meta: Mapping[str, tuple[tuple[int, ...], str]]) -> dict[str, torch.Tensor]:
    """Receive buffers from (shape, dtype name) metadata (what the trainer's `ready()` reports)."""
    import torch

    return {n: torch.empty(shape, dtype=getattr(torch, dt)) for n, (shape, dt) in meta.items()}


def timed(fn, *args) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


class EngineChannel:
    """A rollout worker's end of `object_store` / `broadcast` (the hub mode does not use it).

        ch = EngineChannel(engine, clock, poll_s=0.005)
        (object_store: the run's `RefBoard`, found by name)
        ch.connect(broadcast=(host, port, world, rank), meta=meta)   # broadcast: blocks until all joined
        ch.pull(min_version)   # object_store: wait for a version >= min_version on the board, get it, reload
        ch.recv()              # broadcast: take part in the trainer's next broadcast (blocks), reload
    Each update records a `fetch` event (bytes_by_source {"object_store"|"broadcast": n})."""

    def __init__(self, engine: Any, clock: Any, hub_address: str, poll_s: float = 0.005):
        self.engine, self.clock, self.poll_s, self.hub_address = engine, clock, poll_s, hub_address
        self.board = self.bcast = self.meta = None

    def connect(self, broadcast: tuple | None = None, meta=None) -> None:
        self.meta = meta
        if broadcast is not None:
            host, port, world, rank, timeout_s = broadcast
            self.bcast = GlooBroadcast(host, port, rank, world, timeout_s)

    def _event(self, source: str, version: int, n: int, seconds: float, **extra) -> None:
        from rlsync.core.events import FetchEvent

        ev = FetchEvent(version=version, bytes=n, seconds=seconds, sources=(source,),
                        bytes_by_source={source: n}, **extra)
        self.clock.event(FetchEvent.NAME, **ev.attrs())

    def pull(self, min_version: int, join: bool = False) -> None:
        import ray

        if self.board is None:
            self.board = get_board(self.hub_address)
        with self.clock.state("waiting_weights"):
            while True:
                version, refs = ray.get(self.board.latest.remote())
                if version >= min_version and version > self.engine.version:
                    break
                if version >= min_version or (join and version < 0):
                    return  # nothing newer than what the engine holds (or, joining, nothing published yet)
                time.sleep(self.poll_s)
        t0 = time.perf_counter()
        with self.clock.state("loading_weights"):
            sd = ray.get(refs[0])  # a copy into this process
            apply_weights(self.engine, sd, version)
        self.engine.version = version
        self._event("object_store", version, nbytes(sd), time.perf_counter() - t0, join=join)

    def recv(self) -> int:
        with self.clock.state("waiting_weights"):
            version = self.bcast.rendezvous(-1)
        t0 = time.perf_counter()
        with self.clock.state("loading_weights"):
            if hasattr(self.engine, "load_state"):  # HF: receive straight into the live parameters
                buf = self.engine.named_parameters_for_sync()
                self.bcast.tensors(buf)
            else:
                buf = recv_buffers(self.meta)
                self.bcast.tensors(buf)
                apply_weights(self.engine, buf, version)
        self.engine.version = version
        self._event("broadcast", version, nbytes(buf), time.perf_counter() - t0)
        self.clock.enter("idle")
        return version


class DriverChannels:
    """The driver's side of `sync.mode` object_store / broadcast: set-up, and the broadcast after each publish.

        ch = DriverChannels(cfg, hub_address)          # object_store: the run's RefBoard, before workers start
        ch.start(trainers, pools, timeout_s)           # broadcast: the static group
        ch.after_publish()     # broadcast: the trainer and every engine take part in one broadcast (queued)
        ch.may_start(min_version, published)   # broadcast: a request needing an unsent version must wait
    """

    def __init__(self, cfg, hub_address: str):
        import ray

        self.cfg, self.mode, self.hub_address = cfg, cfg.sync.mode, hub_address
        self._pending: list = []
        self.board = None
        if self.mode == "object_store":
            self.board = ray.remote(RefBoard).options(name=board_name(hub_address), num_cpus=0).remote()

    def start(self, trainers, pools, timeout_s: float) -> None:
        import ray

        self.trainers, self.pools = trainers, pools
        if self.mode == "object_store":
            ray.get([h.set_channel.remote() for h in self.trainers.members.values()], timeout=timeout_s)
        elif self.mode == "broadcast":
            from rlsync.trainer import free_port

            t0 = next(iter(self.trainers.members.values()))
            meta = ray.get(t0.set_channel.remote(), timeout=timeout_s)
            engines = self._engines()
            host, port, world = "127.0.0.1", free_port(), 1 + len(engines)
            refs = [t0.set_channel.remote((host, port, world))]
            refs += [h.set_channel.remote((host, port, world, i + 1, self.cfg.sync.broadcast_timeout_s), meta)
                     for i, h in enumerate(engines)]
            ray.get(refs, timeout=timeout_s)
            log.info("broadcast group of %d members (trainer rank 0 + %d engines) on port %d", world, world - 1, port)

    def _engines(self) -> list:
        return [h for p in self.pools.pools.values() for h in p.group.members.values()]

    def after_publish(self, wait: bool = False) -> None:
        """broadcast: queue the send on the trainer and a receive on every engine (each runs after the call the
        actor is busy with: an engine finishing a batch holds every other member up). Errors surface here."""
        import ray

        if self.mode != "broadcast":
            return
        self.check(timeout_s=self.cfg.timeout_s)
        t0 = next(iter(self.trainers.members.values()))
        self._pending = [t0.broadcast_weights.remote()] + [h.recv_broadcast.remote() for h in self._engines()]
        if wait:
            self.check(timeout_s=self.cfg.timeout_s)

    def check(self, timeout_s: float) -> None:
        import ray

        pending, self._pending = self._pending, []
        if pending:
            ray.get(pending, timeout=timeout_s)

    def may_start(self, min_version: int, published: int) -> bool:
        """broadcast: no request for a version not broadcast yet (it would be queued before that broadcast)."""
        return self.mode != "broadcast" or min_version <= published
