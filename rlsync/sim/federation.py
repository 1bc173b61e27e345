"""`python -m rlsync.sim federation`: one cross-DC weight update at paper scale over 10 DCs, one hub
for every DC vs a hub per DC (hub/federation/gateway.py), the same engines, links and shard.

- one hub: the paper's crossdc workload (rlsync/sim/paper.py): one real `HubState` plans every read
  of every DC (its cross-DC rule sends one transfer into each DC, then relays fan out inside it).
- a hub per DC: dc0's hub is the home of the model (the trainer's replicas and dc0's engines); each
  other DC has its own real `HubState` and a gateway node. What the gateway does is what
  `rlsync.hub.federation.gateway.Gateway` does: it polls the home hub's latest (at a uniformly random phase
  of `poll_ms`), fetches the version from the home hub (which plans that read: the only bytes that
  cross into its DC), then publishes it to its DC's hub (the commit there); only then do that DC's
  engines fetch, from their own hub, which plans every read inside the DC.

Both run on one `Engine` (one clock, one network, max-min fair links). Reported per system: the
remote engines' wait and GPU stall, the copies of the shard that crossed into each DC (bytes over
each DC's WAN downlink / shard bytes), and each hub's load (requests, busy seconds: the real
`HubState` calls' CPU time).
"""
from __future__ import annotations

import random
from dataclasses import asdict

from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.state import HubConfig

from .cluster import SimCluster
from .engine import Engine, Flow
from .paper import GB, PaperSetup, _check, _hub, _place, _run_fetches

MODEL = "policy"


class CountingEngine(Engine):
    """The engine, counting the bytes of every flow that crosses into a DC (its `dc:D:down` link)."""

    def __init__(self, net) -> None:
        super().__init__(net)
        self.crossed: dict[str, float] = {}

    def start(self, flow: Flow) -> Flow:
        for link in flow.links:
            if link.startswith("dc:") and link.endswith(":down"):
                dc = link.split(":")[1]
                self.crossed[dc] = self.crossed.get(dc, 0.0) + flow.nbytes
        return super().start(flow)


def _cluster(p: PaperSetup, net, engine: Engine) -> SimCluster:
    c = SimCluster(net, HubConfig(planner=PlannerConfig(fanout_cap=p.fanout_cap)), unit_bytes=int(p.unit_mib * (1 << 20)),
                   rpc_s=p.rpc_ms / 1e3, hub_service_s=None if p.hub_service_ms < 0 else p.hub_service_ms / 1e3)
    c.engine = engine  # every hub on one clock and one network (HubState's clock reads c.engine)
    return c


def one_hub(p: PaperSetup) -> dict:
    net, trainers, engines = _place(p, p.dcs)
    c = _hub(p, net, trainers, False)
    eng = c.engine = CountingEngine(net)
    done = _run_fetches(c, engines, seed=p.order_seed)
    eng.run()
    _check(c, done, engines, "federation one hub")
    return _summary(p, net, done, eng, {"dc0": c}, gateway_s={})


def federated(p: PaperSetup, poll_ms: float = 50.0, seed: int = 0) -> dict:
    net, trainers, engines = _place(p, p.dcs)
    by_dc: dict[str, list[str]] = {}
    for e in engines:
        by_dc.setdefault(net.nodes[e].location.dc, []).append(e)
    remote = sorted((dc for dc in by_dc if dc != "dc0"), key=lambda d: int(d[2:]))
    gws = {dc: f"gw_{dc}" for dc in remote}
    for dc, gw in gws.items():
        net.add(gw, dc=dc, rack="gateway")
    eng = CountingEngine(net)
    home = _hub(p, net, trainers, False)
    home.engine = eng
    hubs = {"dc0": home, **{dc: _cluster(p, net, eng) for dc in remote}}
    done: dict[str, float] = {}
    gateway_s: dict[str, dict] = {}
    fills = [_run_fetches(home, by_dc.get("dc0", []), seed=p.order_seed)]  # each fills in as the engine runs
    rng = random.Random(seed)
    for dc in remote:
        gw, local = gws[dc], hubs[dc]
        home.join(gw)   # a reader of the home hub, located in its own DC
        local.join(gw)  # and the publisher of the model in its DC's hub

        def committed(_out, dc=dc, local=local) -> None:
            gateway_s[dc]["committed_s"] = eng.now
            fills.append(_run_fetches(local, by_dc[dc], seed=p.order_seed))

        def fetched(t, dc=dc, gw=gw, local=local, committed=committed) -> None:
            gateway_s[dc]["fetched_s"] = t
            local.publish(gw, MODEL, 1, int(p.shard_bytes), then=committed)

        def learned(m, gw=gw, fetched=fetched) -> None:
            home.fetch(gw, MODEL, m.latest, on_done=fetched)

        def poll(dc=dc, learned=learned) -> None:
            gateway_s[dc] = {"polled_s": eng.now}
            home.call(home.hub.model, MODEL, reply=learned)  # the gateway's `latest` RPC to the home hub
        eng.at(rng.uniform(0.0, poll_ms / 1e3), poll)
    eng.run()
    for f in fills:
        done.update(f)
    errors = [e for c in hubs.values() for e in c.errors]
    if len(done) != len(engines) or errors:
        raise RuntimeError(f"federation: {len(engines) - len(done)} engines never finished; {errors[:3]}")
    return _summary(p, net, done, eng, hubs, gateway_s)


def _summary(p: PaperSetup, net, done: dict, eng: CountingEngine, hubs: dict, gateway_s: dict) -> dict:
    rem = [t for e, t in done.items() if net.nodes[e].location.dc != "dc0"]
    copies = {dc: round(b / p.shard_bytes, 3) for dc, b in sorted(eng.crossed.items(), key=lambda kv: int(kv[0][2:]))}
    return {"remote_gpu_stall_s": p.engine_gpus * sum(rem), "mean_remote_wait_s": sum(rem) / len(rem),
            "last_remote_s": max(rem), "last_dc0_s": max(t for e, t in done.items()
                                                          if net.nodes[e].location.dc == "dc0"),
            "copies_into_dc": copies, "cross_dc_bytes_per_rail": sum(eng.crossed.values()),
            "hubs": {dc: {"workers": len(c.hub.workers), "requests": c.rpcs, "busy_s": round(c.hub_busy_s, 4)}
                     for dc, c in hubs.items()},
            "max_hub_requests": max(c.rpcs for c in hubs.values()),
            "max_hub_busy_s": max(c.hub_busy_s for c in hubs.values()),
            "first_done_s": {dc: min(t for e, t in done.items() if net.nodes[e].location.dc == dc)
                             for dc in copies},
            "gateways": gateway_s}


def run(p: PaperSetup, poll_ms: float = 50.0) -> dict:
    systems = {"one hub": one_hub(p), "hub per DC": federated(p, poll_ms)}
    a, b = systems["one hub"], systems["hub per DC"]
    return {"setup": asdict(p), "poll_ms": poll_ms, "shard_gb": p.shard_bytes / GB, "systems": systems,
            "federated_vs_one_hub": {
                "remote_gpu_stall": round(b["remote_gpu_stall_s"] / a["remote_gpu_stall_s"], 3),
                "last_remote": round(b["last_remote_s"] / a["last_remote_s"], 3),
                "cross_dc_bytes": round(b["cross_dc_bytes_per_rail"] / a["cross_dc_bytes_per_rail"], 3),
                "max_hub_requests": round(b["max_hub_requests"] / a["max_hub_requests"], 3),
                "max_hub_busy": round(b["max_hub_busy_s"] / max(a["max_hub_busy_s"], 1e-12), 3)}}


def print_federation(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=160)
    s = res["setup"]
    c.print(f"one cross-DC update: {s['params']:.3g} params, shard {res['shard_gb']:.1f} GB per GPU, {s['engines']:,} "
            f"engines over {s['dcs']} DCs, WAN {s['wan_gbit_per_dc']:g} Gbit/s per DC, NIC {s['nic_gbit']:g} Gbit/s, "
            f"RPC {s['rpc_ms']} ms, gateway poll {res['poll_ms']} ms (other assumptions: python -m rlsync.sim paper)")
    t = Table(title="one hub vs a hub per DC (one rail; stall x engine_gpus)")
    for col in ("system", "remote GPU stall (GPU-s)", "mean remote wait (s)", "last remote (s)", "last dc0 (s)",
                "copies into each DC (min-max)", "busiest hub: requests", "busiest hub: busy s"):
        t.add_column(col, justify="right" if col != "system" else "left")
    for name, v in res["systems"].items():
        cp = list(v["copies_into_dc"].values())
        t.add_row(name, f"{v['remote_gpu_stall_s']:,.0f}", f"{v['mean_remote_wait_s']:.2f}", f"{v['last_remote_s']:.2f}",
                  f"{v['last_dc0_s']:.2f}", f"{min(cp):.2f}-{max(cp):.2f}", f"{v['max_hub_requests']:,}",
                  f"{v['max_hub_busy_s']:.3f}")
    c.print(t)
    c.print("hub per DC / one hub: " + ", ".join(f"{k} {v}x" for k, v in res["federated_vs_one_hub"].items()))
    c.print(f"elapsed {res.get('elapsed_s', 0)} s")
