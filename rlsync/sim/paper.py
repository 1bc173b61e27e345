"""`python -m rlsync.sim paper`: the paper's three workloads at its scale, rlsync vs the baselines.

Scale (every figure is a `PaperSetup` field, printed with the results; override any with
`--set name=value`): a 1T-parameter model in bf16, rollout engines of 32 GPUs holding a 1/32 shard
each, one 200 Gbit/s RDMA NIC per GPU, a 2,048-GPU trainer, 1,024 engines, 4 DCs.

Rail symmetry: every GPU has its own NIC and each engine's rank k reads only shard k, so the 32
shards move independently over per-GPU NICs ("rails"); they share only links above the NIC (the
WAN here: the DC fabric is assumed non-blocking). The simulator runs ONE rail — rank k of every
engine and of every trainer replica — with the WAN's capacity divided by the rails, and multiplies
stalls by the GPUs per rail member. The trainer's data-parallel replicas all hold the new weights
after the optimizer step; rank k of each registers its copy (no copy made) as a source.

Workloads (one weight update each; stall in GPU-seconds, the paper's "total GPU stall time"):
- standalone: every engine fetches the new version at once; the trainer keeps training `train_s`
  and then releases (any wait there stalls every trainer GPU).
- elastic: half the engines hold the version, the other half join at once (join RPC) and fetch it;
  figure: seconds until the last joiner holds it (and the joiners' GPU stall).
- crossdc: trainer and 1/`dcs` of the engines in dc0, the rest spread over the other DCs behind
  their WAN links; figure: the remote engines' GPU stall.
Baselines: NCCL-style broadcast (pipelined chains rooted at the trainer replicas; everyone in the
call blocked; one chain per remote DC in crossdc), trainer-only p2p (the real hub restricted to the
trainer's hosts: UCX's shape) and an object store (put, then get; per-stream copy rate).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields

from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import HubConfig

from . import baselines
from .cluster import SimCluster
from .network import Network

GB = 1e9


@dataclass(kw_only=True, slots=True)
class PaperSetup:
    params: float = 1e12
    """Model parameters (the issue's 1T)."""
    bytes_per_param: int = 2
    """bf16 weights."""
    engine_gpus: int = 32
    """GPUs per rollout engine (TP x PP); each holds 1/engine_gpus of the weights (62.5 GB here)."""
    engines: int = 1024
    """Rollout engines (32,768 rollout GPUs)."""
    trainer_gpus: int = 2048
    """Trainer GPUs: trainer_gpus / engine_gpus data-parallel replicas of each shard serve as sources."""
    nic_gbit: float = 200.0
    """One RDMA NIC per GPU, Gbit/s each way."""
    nic_efficiency: float = 0.88
    """Goodput / line rate: the paper's 22 GB/s on a 50 GB shard (88% of the RDMA peak)."""
    dcs: int = 4
    """crossdc: DCs (the trainer's and dcs - 1 remote ones)."""
    wan_gbit_per_dc: float = 1600.0
    """Each DC's WAN link, Gbit/s each way, shared by all rails."""
    wan_efficiency: float = 0.9
    """TCP goodput on the WAN."""
    unit_mib: float = 64.0
    """rlsync's transfer unit (relay pipeline grain)."""
    nccl_chunk_mib: float = 4.0
    """NCCL pipeline chunk per hop."""
    rpc_ms: float = 0.5
    """Hub RPC round trip in the DC (the hub's own time per request: hub_service_ms)."""
    hub_service_ms: float = -1.0
    """Hub time per request: < 0 = the CPU time the real HubState call takes in this process (a hub
    with a core to itself); >= 0 = that fixed time (0: an instantaneous hub)."""
    train_s: float = 60.0
    """standalone: the trainer's step after publishing, before it must release."""
    store_nodes: int = 128
    """Object store: storage nodes in the cluster (same NICs); store_nodes / engine_gpus serve a rail."""
    store_copy_gbyte_s: float = 1.25
    """Object store: per-stream copy rate, GB/s (the paper's Ray object store: 40 GB in 32 s)."""
    preempt_frac: float = 0.0
    """elastic: this fraction of the holders (those serving a read first) is preempted without notice
    1 s into the joiners' fetch; their readers re-plan; the hub expires them after its worker timeout."""
    order_seed: int = -1
    """The order in which engines updated at one instant reach the hub: -1 = by name (rack by rack);
    >= 0 = shuffled with this seed (as the validation does: the benchmarks' agents fire at once)."""
    fanout_cap: int = 1
    """rlsync planner fan-out cap: 1, as in the emulated benchmarks: with equal NICs a chain pipelines at link rate (the hub default, 4, splits an uplink four ways)."""
    max_sources: int = 2
    """rlsync planner max_sources: the hub default 2 (the emulated benchmarks use 1; docs/scale.md: with 2, shuffled arrivals end in one long chain)."""

    @property
    def shard_bytes(self) -> float:
        return self.params * self.bytes_per_param / self.engine_gpus

    @property
    def trainer_replicas(self) -> int:
        return max(1, self.trainer_gpus // self.engine_gpus)


def _net(p: PaperSetup, dcs: int = 1) -> Network:
    return Network(nic_bps=p.nic_gbit * 1e9 / 8, efficiency=p.nic_efficiency,
                   dc_link_bps=(p.wan_gbit_per_dc * 1e9 / 8 / p.engine_gpus * p.wan_efficiency / p.nic_efficiency)
                   if dcs > 1 else None)


def _place(p: PaperSetup, dcs: int) -> tuple[Network, list[str], list[str]]:
    """Trainer replicas t* in dc0; engines e* spread evenly over the DCs (one node each: rank k of it)."""
    net = _net(p, dcs)
    trainers = [f"t{i}" for i in range(p.trainer_replicas)]
    for i, t in enumerate(trainers):
        net.add(t, dc="dc0", rack=f"tr{i // 32}")
    engines = [f"e{i}" for i in range(p.engines)]
    per_dc = -(-p.engines // dcs)
    for i, e in enumerate(engines):
        net.add(e, dc=f"dc{i // per_dc}", rack=f"r{i // 32}")
    return net, trainers, engines


def _hub(p: PaperSetup, net: Network, trainers: list[str], p2p: bool) -> SimCluster:
    planner = (PlannerConfig(fanout_cap=1 << 20, max_sources=1, source_hosts=tuple(trainers)) if p2p
               else PlannerConfig(fanout_cap=p.fanout_cap, max_sources=p.max_sources))
    c = SimCluster(net, HubConfig(planner=planner), unit_bytes=int(p.unit_mib * (1 << 20)),
                   rpc_s=p.rpc_ms / 1e3, hub_service_s=None if p.hub_service_ms < 0 else p.hub_service_ms / 1e3)
    for t in trainers:
        c.join(t)
    c.publish(trainers[0], "policy", 1, int(p.shard_bytes), rpc=False)
    m = c.manifests[("policy", 1, "tp0-pp0")]
    for t in trainers[1:]:  # the other DP replicas' identical copies (no copy made)
        c.hub.register_replica(c.wid[t], "policy", 1, Shard(), "live", m)
    return c


def _run_fetches(c: SimCluster, readers: list[str], join: bool = False, seed: int = 0) -> dict[str, float]:
    done: dict[str, float] = {}
    readers = list(readers)
    if seed >= 0:
        random.Random(seed).shuffle(readers)
    for r in readers:
        if join:
            c.join_rpc(r, lambda _w, r=r: c.fetch(r, "policy", 1, on_done=lambda t, r=r: done.__setitem__(r, t)))
        else:
            c.join(r)
            c.fetch(r, "policy", 1, on_done=lambda t, r=r: done.__setitem__(r, t))
    return done


def _check(c: SimCluster, done: dict, readers: list[str], what: str) -> None:
    if len(done) != len(readers) or c.errors:
        raise RuntimeError(f"{what}: {len(readers) - len(done)} readers never finished; {c.errors[:3]}")


def standalone(p: PaperSetup) -> dict:
    out = {}
    for system, p2p in (("rlsync", False), ("trainer-only p2p", True)):
        net, trainers, engines = _place(p, 1)
        c = _hub(p, net, trainers, p2p)
        done = _run_fetches(c, engines, seed=p.order_seed)
        released: list[float] = []
        for t in trainers:
            c.engine.at(p.train_s, c.release, t, "policy", 1, Shard(), "live", released.append)
        c.engine.run()
        _check(c, done, engines, f"standalone {system}")
        trainer_wait = max(0.0, max(released) - p.train_s)
        out[system] = _stall(p, done.values(), trainer_wait, hub_busy_s=c.hub_busy_s)
    net, trainers, engines = _place(p, 1)
    groups = [(t, engines[i::len(trainers)]) for i, t in enumerate(trainers)]
    done = baselines.broadcast(net, groups, p.shard_bytes, p.nccl_chunk_mib * (1 << 20))
    out["NCCL broadcast"] = _stall(p, done.values(), max(done[g[0]] for _, g in groups))
    put, done = _store(p, net, trainers[0], engines)
    out["object store"] = _stall(p, done.values(), put)
    return out


def elastic(p: PaperSetup) -> dict:
    out = {}
    half = p.engines // 2
    for system, p2p in (("rlsync", False), ("trainer-only p2p", True)):
        net, trainers, engines = _place(p, 1)
        c = _hub(p, net, trainers, p2p)
        m = c.manifests[("policy", 1, "tp0-pp0")]
        for e in engines[:half]:  # they hold the version already
            c.join(e)
            c.hub.register_replica(c.wid[e], "policy", 1, Shard(), "live", m)
        joiners = engines[half:]
        done = _run_fetches(c, joiners, join=True, seed=p.order_seed)
        c.engine.at(1.0, _preempt_serving, c, engines[:half], int(half * p.preempt_frac))
        c.engine.run()
        _check(c, done, joiners, f"elastic {system}")
        out[system] = {**_stall(p, done.values(), 0.0, trainer=False), "seconds": max(done.values())}
    net, trainers, engines = _place(p, 1)
    _, done = _store(p, net, trainers[0], engines[half:], put_first=False)
    out["object store"] = {**_stall(p, done.values(), 0.0, trainer=False), "seconds": max(done.values())}
    return out


def _preempt_serving(c: SimCluster, holders: list[str], k: int) -> None:
    serving = {v[2] for r in c.runs.values() for v in r.pending.values()}
    for e in sorted(holders, key=lambda h: (h not in serving, h))[:k]:
        c.preempt(e)


def crossdc(p: PaperSetup) -> dict:
    out = {}
    for system, p2p in (("rlsync", False), ("trainer-only p2p", True)):
        net, trainers, engines = _place(p, p.dcs)
        c = _hub(p, net, trainers, p2p)
        done = _run_fetches(c, engines, seed=p.order_seed)
        c.engine.run()
        _check(c, done, engines, f"crossdc {system}")
        out[system] = _remote(p, net, done)
    net, trainers, engines = _place(p, p.dcs)
    by_dc: dict[str, list[str]] = {}
    for e in engines:
        by_dc.setdefault(net.nodes[e].location.dc, []).append(e)
    local = by_dc.pop("dc0", [])
    roots = trainers[len(by_dc):] or trainers
    groups = [(trainers[i % len(trainers)], members) for i, members in enumerate(by_dc.values())]
    groups += [(t, local[i::len(roots)]) for i, t in enumerate(roots) if local[i::len(roots)]]
    out["NCCL broadcast"] = _remote(p, net, baselines.broadcast(net, groups, p.shard_bytes, p.nccl_chunk_mib * (1 << 20)))
    _, done = _store(p, net, trainers[0], engines)
    out["object store"] = _remote(p, net, done)
    return out


def _store(p: PaperSetup, net: Network, writer: str, readers: list[str], put_first: bool = True):
    """The store's nodes for this rail sit in dc0 (racks of their own)."""
    n = max(1, p.store_nodes // p.engine_gpus)
    stores = [f"s{i}" for i in range(n)]
    for s in stores:
        if s not in net.nodes:
            net.add(s, dc="dc0", rack="store")
    put, done = baselines.object_store(net, writer, stores, readers, p.shard_bytes, p.store_copy_gbyte_s * GB)
    if not put_first:  # the version was put earlier: readers' time counts from their gets
        done = {r: t - put for r, t in done.items()}
    return put, done


def _stall(p: PaperSetup, reader_s, trainer_s: float, trainer: bool = True, hub_busy_s: float = 0.0) -> dict:
    reader_s = list(reader_s)
    ro = p.engine_gpus * sum(reader_s)
    tr = p.trainer_gpus * trainer_s if trainer else 0.0
    return {"total_gpu_stall_s": ro + tr, "rollout_gpu_stall_s": ro, "trainer_gpu_stall_s": tr,
            "mean_engine_wait_s": sum(reader_s) / len(reader_s), "last_engine_s": max(reader_s),
            "trainer_wait_s": trainer_s if trainer else None, "hub_busy_s": hub_busy_s}


def _remote(p: PaperSetup, net: Network, done: dict) -> dict:
    remote = [t for e, t in done.items() if net.nodes[e].location.dc != "dc0"]
    return {"remote_gpu_stall_s": p.engine_gpus * sum(remote), "mean_remote_wait_s": sum(remote) / len(remote),
            "last_remote_s": max(remote), "all_gpu_stall_s": p.engine_gpus * sum(done.values())}


WORKLOADS = {"standalone": (standalone, "total_gpu_stall_s"), "elastic": (elastic, "seconds"),
             "crossdc": (crossdc, "remote_gpu_stall_s")}


def run(p: PaperSetup, only: list[str] | None = None) -> dict:
    res = {"setup": asdict(p), "shard_gb": p.shard_bytes / GB, "trainer_replicas": p.trainer_replicas,
           "workloads": {}}
    for name, (fn, key) in WORKLOADS.items():
        if only and name not in only:
            continue
        systems = fn(p)
        base = systems["rlsync"][key]
        res["workloads"][name] = {"figure": key, "systems": systems,
                                  "ratio_vs_rlsync": {s: round(v[key] / base, 2) for s, v in systems.items()
                                                      if s != "rlsync"}}
    return res


def parse_set(items: list[str]) -> PaperSetup:
    kinds = {f.name: f.type for f in fields(PaperSetup)}
    kw = {}
    for it in items:
        k, _, v = it.partition("=")
        if k not in kinds:
            raise SystemExit(f"--set {k}: unknown; known: {', '.join(kinds)}")
        kw[k] = int(v) if kinds[k] in ("int", int) else float(v)
    return PaperSetup(**kw)
