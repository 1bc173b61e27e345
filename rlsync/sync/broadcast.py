"""`sync.mode=broadcast`: NCCL's shape (on gloo here), a baseline the same loop can run.

One static process group of the trainer's rank 0 and every engine, made at start. After each step the
driver asks the trainer and every engine to take part in one broadcast of the whole model; every engine
blocks until all have arrived (an engine finishing a batch holds up the trainer and all the others), and
the group cannot change size (no elastic pools or trainers: `Broadcast.misfit`).

Accounting: trainer `offloading` = the collective, including the wait for every engine; engines
`waiting_weights` (the others have not arrived) and `loading_weights`; a `fetch` event per update with
bytes_by_source {"broadcast": n}.
"""
from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Mapping

from rlsync.core.digest import nbytes
from rlsync.core.events import FetchEvent

from .base import SyncCoordinator, WeightPublisher, WeightReceiver, WeightSync, register_weight_sync
from .engine import need

log = logging.getLogger(__name__)


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

    def tensors(self, tensors: Mapping[str, Any]) -> None:
        for name in sorted(tensors):
            self.pg.broadcast(tensors[name], 0).wait()


def recv_buffers(meta: Mapping[str, tuple[tuple[int, ...], str]]) -> dict:
    """Receive buffers from (shape, dtype name) metadata (what the trainer's `sync_connect` reports)."""
    import torch

    return {n: torch.empty(shape, dtype=getattr(torch, dt)) for n, (shape, dt) in meta.items()}


class BroadcastPublisher(WeightPublisher):
    def connect(self, backend: Any, arg: Any = None) -> dict:
        """`arg`: (host, port, world_size) of the static group, joined as its rank 0 (returns once every
        engine has joined); None: just the metadata the engines make their buffers from."""
        if arg is not None and self.rank == 0:
            host, port, world = arg
            self._bcast = GlooBroadcast(host, port, 0, world, self.side.sync.broadcast_timeout_s)
        return super().connect(backend, arg)

    def publish(self, backend: Any) -> dict:
        v, tensors, n = self._whole(backend)
        if self.rank == 0:
            self._to_send = (v, tensors)  # live tensors; sent before the next step writes them
            self.clock.event("publish", version=v, bytes=n)
        return {"version": v, "bytes": n}

    def push(self) -> dict:
        """Rank 0: send the last published version to every engine (all block)."""
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


class BroadcastReceiver(WeightReceiver):
    def __init__(self, side, engine, *, params=None, delay_s: float = 0.0):
        super().__init__(side, engine, params=params, delay_s=delay_s)
        need(self.caps, "broadcast", "in_place_fetch", "load_state")
        self.bcast = self.meta = None

    def connect(self, arg: Any, meta: dict) -> None:
        """Join the static group: `arg` = (host, port, world, rank, timeout_s); blocks until all have."""
        host, port, world, rank, timeout_s = arg
        self.meta = meta
        self.bcast = GlooBroadcast(host, port, rank, world, timeout_s)

    def ensure(self, min_version: int, eager: bool = False) -> None:
        if self.engine.version < min_version:  # the driver queued the broadcast ahead of this call
            raise RuntimeError(f"broadcast mode: engine holds v{self.engine.version} < {min_version}")

    def join(self) -> dict[str, int]:
        return {}  # a static group: nobody joins a running job

    def push(self) -> int:
        """Take part in the trainer's broadcast of the next version (blocks until all have); reload."""
        with self.clock.state("waiting_weights"):
            version = self.bcast.rendezvous(-1)
        t0 = time.perf_counter()
        with self.clock.state("loading_weights"):
            if self.caps.in_place_fetch:  # receive straight into the live parameters
                buf = self.engine.named_parameters_for_sync()
                self.bcast.tensors(buf)
            else:
                buf = recv_buffers(self.meta)
                self.bcast.tensors(buf)
                self.engine.load_state(buf, version=version)
        self.engine.version = version
        n = nbytes(buf)
        ev = FetchEvent(version=version, bytes=n, seconds=time.perf_counter() - t0, sources=("broadcast",),
                        bytes_by_source={"broadcast": n})
        self.clock.event(FetchEvent.NAME, **ev.attrs())
        self.clock.enter("idle")
        return version


class BroadcastCoordinator(SyncCoordinator):
    """The static group at start, and one queued broadcast after each publish."""

    def __init__(self, sync, hub_address: str, timeout_s: float):
        super().__init__(sync, hub_address, timeout_s)
        self._pending: list = []

    def start(self, trainers: Any, pools: Any, timeout_s: float) -> None:
        import ray
        from torch.distributed.elastic.utils.distributed import get_free_port

        self.trainers, self.pools = trainers, pools
        t0 = next(iter(trainers.members.values()))
        meta = ray.get(t0.sync_connect.remote(), timeout=timeout_s)
        engines = self._engines()
        host, port, world = "127.0.0.1", get_free_port(), 1 + len(engines)
        refs = [t0.sync_connect.remote((host, port, world))]
        refs += [h.sync_connect.remote((host, port, world, i + 1, self.sync.broadcast_timeout_s), meta)
                 for i, h in enumerate(engines)]
        ray.get(refs, timeout=timeout_s)
        log.info("broadcast group of %d members (trainer rank 0 + %d engines) on port %d", world, world - 1, port)

    def _engines(self) -> list:
        return [h for p in self.pools.pools.values() for h in p.group.members.values()]

    def after_publish(self, wait: bool = False) -> None:
        """Queue the send on the trainer and a receive on every engine (each runs after the call the actor
        is busy with: an engine finishing a batch holds every other member up). Errors surface here."""
        self.check(timeout_s=self.timeout_s)
        t0 = next(iter(self.trainers.members.values()))
        self._pending = [t0.sync_push.remote()] + [h.sync_push.remote() for h in self._engines()]
        if wait:
            self.check(timeout_s=self.timeout_s)

    def check(self, timeout_s: float) -> None:
        import ray

        pending, self._pending = self._pending, []
        if pending:
            ray.get(pending, timeout=timeout_s)

    def may_start(self, min_version: int, published: int) -> bool:
        """No request for a version not broadcast yet (it would be queued before that broadcast)."""
        return min_version <= published


@register_weight_sync("broadcast")
class Broadcast(WeightSync):
    mode = "broadcast"
    publisher, receiver, coordinator = BroadcastPublisher, BroadcastReceiver, BroadcastCoordinator

    @classmethod
    def misfit(cls, sync, shape) -> str | None:
        if shape.moving_pools:
            return f"needs a static group: pools {list(shape.moving_pools)} are not `fixed`"
        if shape.elastic_trainer:
            return "needs a static group: trainer.elastic is on"
        return None
