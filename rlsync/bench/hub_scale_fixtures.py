"""hub_scale's fixtures, shared by its in-process phases (`hub_scale.py`) and its real-server client
processes (`_hub_scale_rpc.py`): the topology's worker placement, the 8 GiB manifest, endpoints, and
a `HubState` already holding v1 at N workers.

    f = HubStateFixture(1000, big_manifest(units=11))   # trainer in dc0, 1,000 workers holding v1
    f.publish(2, f.workers[::2])                         # v2, held by every other worker
"""
from __future__ import annotations

import random

from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import Manifest, TensorSpec, Unit
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import HubConfig, HubState

MODEL, SHARD = "policy", Shard()
DCS, RACKS, PER_HOST = 4, 16, 8
UNIT_BYTES = 8 << 20


def location(i: int) -> Location:
    """Worker i: host i // 8; hosts spread over 4 DCs, then 16 racks per DC."""
    h = i // PER_HOST
    return Location(dc=f"dc{h % DCS}", rack=f"r{(h // DCS) % RACKS}", host=f"h{h}")


def big_manifest(units: int = 1001, seed: int = 0) -> Manifest:
    """`units` tensors of 8 MiB, one transfer unit each (an 8 GiB model); checksums are arbitrary."""
    rng = random.Random(seed)
    n = UNIT_BYTES // 4
    tensors = tuple(TensorSpec(f"layer{i}.weight", "float32", (n,), UNIT_BYTES) for i in range(units))
    us = tuple(Unit(((i, 0, UNIT_BYTES),), UNIT_BYTES, rng.getrandbits(64)) for i in range(units))
    return Manifest(tensors, us, UNIT_BYTES * units)


def endpoint(i: int) -> dict:
    return {"tcp": f"10.0.{i // 250}.{i % 250}:7000", "reader_key": i.to_bytes(32, "little")}


class HubStateFixture:
    """A HubState with a trainer (dc0) and `n` workers that all hold v1 (as after a completed fetch)."""

    def __init__(self, n: int, manifest: Manifest) -> None:
        self.manifest = manifest
        self.state = HubState(HubConfig(worker_timeout_s=1e9))
        s = self.state
        self.trainer = s.join("trainer", Location(dc="dc0", rack="r0", host="trainer"), endpoint(10**6))
        s.publish(self.trainer, MODEL, 1, SHARD, manifest)
        self.workers = [s.join(f"w{i}", location(i), endpoint(i)) for i in range(n)]
        for w in self.workers:
            s.register_replica(w, MODEL, 1, SHARD, "live", manifest)

    def publish(self, version: int, holders: list[str]) -> None:
        self.state.publish(self.trainer, MODEL, version, SHARD, self.manifest)
        for w in holders:
            self.state.register_replica(w, MODEL, version, SHARD, "live", self.manifest)
