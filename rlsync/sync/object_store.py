"""`sync.mode=object_store`: the verl/OpenRLHF shape without a hub, a baseline the same loop can run.

After each step trainer rank 0 gathers the state dict and `ray.put`s it (one copy into the object store);
the ref is posted on the run's `RefBoard` actor; each engine, when it needs that version, `ray.get`s it
(a second copy, in its process) and reloads its weights from it (`load_state`).

Accounting (as for every route, on the workers' stall clocks): trainer `offloading` = gather + put;
engines `waiting_weights` (no such version on the board yet) and `loading_weights` (get + reload); a
`fetch` event per update with bytes_by_source {"object_store": n}.
"""
from __future__ import annotations

import time
from typing import Any

from rlsync.core.digest import nbytes
from rlsync.core.events import FetchEvent

from .base import SyncCoordinator, WeightPublisher, WeightReceiver, WeightSync, register_weight_sync
from .engine import need


class RefBoard:
    """A Ray actor holding the object ref of the newest version. Not the weights: the trainer owns the
    object; the board keeps one ref alive, dropping the previous version's."""

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


class ObjectStorePublisher(WeightPublisher):
    def connect(self, backend: Any, arg: Any = None) -> dict:
        self._board = get_board(self.side.hub_address)
        return super().connect(backend, arg)

    def publish(self, backend: Any) -> dict:
        import ray

        v, tensors, n = self._whole(backend)
        if self.rank == 0:
            with self.clock.state("offloading"):  # gather the state dict, one copy into the object store
                ref = ray.put({k: x.detach().contiguous() for k, x in tensors.items()})
                ray.get(self._board.post.remote(v, [ref]))
            self.clock.event("publish", version=v, bytes=n)
        return {"version": v, "bytes": n}


class ObjectStoreReceiver(WeightReceiver):
    def __init__(self, side, engine, *, params=None, delay_s: float = 0.0):
        super().__init__(side, engine, params=params, delay_s=delay_s)
        need(self.caps, "object_store", "load_state")
        self.board = None

    def ensure(self, min_version: int, eager: bool = False) -> None:
        self._pull(min_version)

    def join(self) -> dict[str, int]:
        """Take the board's version now (nothing when none is posted yet); its bytes are on the fetch event."""
        self._pull(0, join=True)
        return {}

    def _pull(self, min_version: int, join: bool = False) -> None:
        import ray

        if self.board is None:
            self.board = get_board(self.side.hub_address)
        with self.clock.state("waiting_weights"):
            while True:
                version, refs = ray.get(self.board.latest.remote())
                if version >= min_version and version > self.engine.version:
                    break
                if version >= min_version or (join and version < 0):
                    return  # nothing newer than what the engine holds (or, joining, nothing published yet)
                time.sleep(self.sync.board_poll_s)
        t0 = time.perf_counter()
        with self.clock.state("loading_weights"):
            sd = ray.get(refs[0])  # a copy into this process
            self.engine.load_state(sd, version=version)
        self.engine.version = version
        n = nbytes(sd)
        ev = FetchEvent(version=version, bytes=n, seconds=time.perf_counter() - t0, sources=("object_store",),
                        bytes_by_source={"object_store": n}, join=join)
        self.clock.event(FetchEvent.NAME, **ev.attrs())


class ObjectStoreCoordinator(SyncCoordinator):
    """The run's `RefBoard` (made before any worker looks for it); the trainers find it at start."""

    def __init__(self, sync, hub_address: str, timeout_s: float):
        import ray

        super().__init__(sync, hub_address, timeout_s)
        self.board = ray.remote(RefBoard).options(name=board_name(hub_address), num_cpus=0).remote()

    def start(self, trainers: Any, pools: Any, timeout_s: float) -> None:
        import ray

        ray.get([h.sync_connect.remote() for h in trainers.members.values()], timeout=timeout_s)


@register_weight_sync("object_store")
class ObjectStore(WeightSync):
    mode = "object_store"
    publisher, receiver, coordinator = ObjectStorePublisher, ObjectStoreReceiver, ObjectStoreCoordinator
