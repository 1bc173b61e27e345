"""The emulated-topology benchmarks (rlsync/bench, docs/benchmarks.md), replayed in the simulator.

Each function builds the same topology as its benchmark (the same hosts, racks, DCs, rates), runs
the same protocol through the real hub state (`SimCluster`), and returns the benchmark's figure:

- `fanout(cfg, n)`: seconds from the shared start to the last of n readers holding a fresh version.
- `elastic(cfg, holders, joiners)`: seconds until the last joiner (join RPC included) holds it.
- `standalone(cfg, rollouts, steps, train_s, trainer_gpus)`: total GPU stall (pool + trainer group).
- `crossdc(cfg, rollouts, dc_ratio)`: total stall of the remote rollouts, and the wall time.

`p2p=True` runs the trainer-only baseline the way the benchmark does: the same hub and data plane,
with `PlannerConfig(source_hosts=("trainer",), fanout_cap=1<<20, max_sources=1)`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.state import HubConfig

from .cluster import SimCluster, bytes_per_s
from .network import Network


@dataclass(kw_only=True, slots=True)
class BenchModel:
    """What a benchmark run was configured with (read from its --json), plus the simulator's own knobs."""
    model_bytes: int = 64 << 20
    nic_rate: str = "250mbit"
    chunk_bytes: int = 512 << 10
    planner: dict = field(default_factory=lambda: {"fanout_cap": 1, "max_sources": 1})
    efficiency: float = 0.972
    """One TCP flow's goodput / the shaped rate (the benchmark's link check: 243 of 250 Mbit/s)."""
    rpc_s: float = 0.002
    """Control-plane round trip of one hub RPC between namespaces (an assumption; see docs/scale.md)."""
    fetch_rpcs: int = 2
    """RPCs of a fetch besides the plan: the release of the buffer's previous replica, fetch_done."""
    order_seed: int | None = None
    """Readers started at one instant reach the hub in a random order (the benchmark's agents all
    fire at `go`): the order shuffled with this seed; None = in name order."""

    def ordered(self, readers: list[str]) -> list[str]:
        if self.order_seed is None:
            return list(readers)
        out = list(readers)
        random.Random(self.order_seed).shuffle(out)
        return out

    def net(self, dc_link_bps: float | None = None) -> Network:
        return Network(nic_bps=bytes_per_s(self.nic_rate), dc_link_bps=dc_link_bps, efficiency=self.efficiency)

    def hub(self, **planner) -> HubConfig:
        return HubConfig(planner=PlannerConfig(**{**self.planner, **planner}))


P2P = {"fanout_cap": 1 << 20, "max_sources": 1, "source_hosts": ("trainer",)}


def _fanout_net(m: BenchModel, readers: int) -> Network:
    """The benchmark's fanout topology: one DC, rack r0 = hub, trainer and half the readers; r1 the rest."""
    net = m.net()
    half = (readers + 1) // 2
    for name in ["hub", "trainer"] + [f"ro{i}" for i in range(half)]:
        net.add(name, dc="dc0", rack="r0")
    for i in range(half, readers):
        net.add(f"ro{i}", dc="dc0", rack="r1")
    return net


def _cluster(m: BenchModel, net: Network, p2p: bool, **planner) -> SimCluster:
    return SimCluster(net, m.hub(**(P2P if p2p else planner)), unit_bytes=m.chunk_bytes, rpc_s=m.rpc_s)


def _fetch_all(c: SimCluster, m: BenchModel, readers: list[str], version, done: dict) -> None:
    """Every reader fetches at once (after the fetch's other RPCs, modelled as their round trips)."""
    extra = m.fetch_rpcs * m.rpc_s
    for r in m.ordered(readers):
        c.fetch(r, "policy", version, on_done=lambda t, r=r: done.__setitem__(r, t + extra))


def round_times(c: SimCluster, m: BenchModel, readers: list[str], version: int) -> dict[str, float]:
    """Publish `version` from the trainer, all `readers` fetch it from t = now; seconds per reader."""
    c.publish("trainer", "policy", version, m.model_bytes, rpc=False)
    t0 = c.engine.now
    done: dict[str, float] = {}
    _fetch_all(c, m, readers, version, done)
    c.engine.run()
    missing = set(readers) - set(done)
    if missing or c.errors:
        raise RuntimeError(f"simulated round failed: {sorted(missing)[:5]} never finished; {c.errors[:3]}")
    return {r: t - t0 for r, t in done.items()}


def fanout(m: BenchModel, n: int, p2p: bool = False) -> float:
    net = _fanout_net(m, n)
    c = _cluster(m, net, p2p)
    readers = [f"ro{i}" for i in range(n)]
    for h in ["trainer"] + readers:
        c.join(h)
    return max(round_times(c, m, readers, 1).values())


def elastic(m: BenchModel, holders: int = 2, joiners: int = 8, p2p: bool = False) -> float:
    net = _fanout_net(m, holders + joiners)
    c = _cluster(m, net, p2p)
    names = [f"ro{i}" for i in range(holders + joiners)]
    hold, join = names[:holders], names[holders:]
    for h in ["trainer"] + hold:
        c.join(h)
    round_times(c, m, hold, 1)  # the m holders already have it (untimed)
    t0 = c.engine.now
    done: dict[str, float] = {}
    extra = (m.fetch_rpcs - 1) * m.rpc_s  # a joiner has no previous replica to release
    for r in m.ordered(join):
        c.join_rpc(r, lambda _wid, r=r: c.fetch(r, "policy", 1,
                                                on_done=lambda t, r=r: done.__setitem__(r, t + extra)))
    c.engine.run()
    if len(done) != len(join) or c.errors:
        raise RuntimeError(f"simulated elastic round failed: {c.errors[:3]}")
    return max(done.values()) - t0


def standalone(m: BenchModel, rollouts: int = 16, steps: int = 3, train_s: float = 4.0,
               trainer_gpus: int = 16) -> dict:
    """rlsync's side of the benchmark: per step the trainer publishes, the pool fetches while the
    trainer trains `train_s`, then the trainer releases (any wait there is the group's stall)."""
    net = _fanout_net(m, rollouts)
    c = _cluster(m, net, False)
    pool = [f"ro{i}" for i in range(rollouts)]
    for h in ["trainer"] + pool:
        c.join(h)
    rollout_stall, trainer_stall = 0.0, 0.0
    for v in range(1, steps + 1):
        t0 = c.engine.now
        per = round_times_async(c, m, pool, v)
        released: list[float] = []
        c.engine.at(train_s, lambda v=v: c.release("trainer", "policy", v, then=released.append))
        c.engine.run()
        if len(per) != rollouts or not released or c.errors:
            raise RuntimeError(f"simulated standalone step {v} failed: {c.errors[:3]}")
        rollout_stall += sum(t - t0 for t in per.values())
        trainer_stall += released[0] - (t0 + train_s)
    return {"total_stall_s": rollout_stall + trainer_gpus * trainer_stall, "rollout_stall_s": rollout_stall,
            "trainer_rank0_stall_s": trainer_stall}


def round_times_async(c: SimCluster, m: BenchModel, readers: list[str], version: int) -> dict[str, float]:
    """Publish now and start every reader's fetch; the dict fills in as the engine runs."""
    c.publish("trainer", "policy", version, m.model_bytes, rpc=False)
    done: dict[str, float] = {}
    _fetch_all(c, m, readers, version, done)
    return done


def crossdc(m: BenchModel, rollouts: int = 40, dc_ratio: float = 0.1, p2p: bool = False) -> dict:
    nic = bytes_per_s(m.nic_rate)
    # The benchmark shapes the DC link at int(NIC bits/s * ratio).
    net = m.net(dc_link_bps=int(nic * 8 * dc_ratio) / 8)
    net.add("hub", dc="dc0", rack="r0")
    net.add("trainer", dc="dc0", rack="r0")
    half = (rollouts + 1) // 2
    pool = [f"ro{i}" for i in range(rollouts)]
    for i, r in enumerate(pool):
        net.add(r, dc="dc1", rack="r0" if i < half else "r1")
    c = _cluster(m, net, p2p, cross_dc_streams=1)
    for h in ["trainer"] + pool:
        c.join(h)
    per = round_times(c, m, pool, 1)
    return {"total_stall_s": sum(per.values()), "wall_s": max(per.values()), "per_reader_s": per}
