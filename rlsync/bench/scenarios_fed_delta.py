"""`crossdc --delta --federated`: the crossdc --delta workload with a hub per DC (hub/federation/gateway.py):
a version's delta crosses the DC link once (dc1's gateway fetches it) and dc1's readers' control
traffic stays inside dc1 (they know only dc1's hub).

    python -m rlsync.bench crossdc --delta --federated --json outputs/bench/crossdc_delta_fed.json

Topology (rlsync/bench/scenarios_federation.py's `spec`): dc0 = {hub (home hubs), trainer}; dc1 =
{hub1 (dc1's hubs), gw (dc1's gateway), R readers} behind the DC link. Every host holds a bf16 model,
the trainer steps with `mutate_real` (agent/cmd_delta.py). Systems, each its own phase of
consecutive versions in one run (a warm-up round, then `--reps` timed rounds):
- `rlsync delta (hub per DC)`: the trainer publishes v's delta, then v, to the home hub; the gateway
  (holding v-1) fetches the delta across, checks v, publishes the delta and v to dc1's hub; each
  reader `fetch_delta`s from dc1's hub.
- `rlsync full (hub per DC)`: the same with full versions (the gateway without deltas, readers `fetch`).
- `rlsync delta (one hub)`: crossdc --delta's delta system (one hub in dc0 plans every read).
Stall of a reader: from v's commit at home (the trainer's publish returned) to the reader holding
v; for a hub per DC it includes the gateway's poll, crossing and commit in dc1. Crossing: every byte
that entered dc1 over the DC link (its veth's kernel counter: data, control RPCs of the gateway and
of everyone else, TCP/IP headers) from just before the publish to the last reader done, over the
encoded delta size (`crossing_bytes_per_delta`, as crossdc --delta counts it). Between rounds the
gateway still polls the home hub: that rate is reported apart (`idle_crossing_bytes_per_s`).
"""
from __future__ import annotations

import logging
import time

from .cluster import BenchCluster, BenchConfig
from .delta_rounds import (BUF, DELTA_BUF, delta_round, join_clients, median, setup_bf16, summarize, tier_gbps,
                           wan_bytes)
from .scenarios_federation import spec as fed_spec
from .topo import parse_rate
from .workload_specs import base_record

log = logging.getLogger(__name__)
FED_DELTA, FED_FULL, ONE_HUB = "rlsync delta (hub per DC)", "rlsync full (hub per DC)", "rlsync delta (one hub)"


def _start_fed(c: BenchCluster, name: str, planner: dict, delta: dict | None, pool: list[str], deltas: bool) -> None:
    """Home hub `name` in dc0, hub `name`1 in dc1 (hub1's agent), readers joined there, the gateway on."""
    c.start_hub(name, planner, delta=delta)
    c.hubs[name + "1"] = c.agents["hub1"].call("hub_start", name=name + "1", ip=c.topo.ip("hub1"), planner=planner,
                                               delta=delta)
    join_clients(c, name, ["trainer"])
    join_clients(c, name + "1", pool)
    g = c.join_args(name, "gw")
    c.agents["gw"].call("gateway_start", home=c.hubs[name], local=c.hubs[name + "1"], ip=g["ip"],
                        location=g["location"], transport=g["transport"], streams=g["streams"],
                        chunk_mib=g["chunk_mib"], io_timeout_s=g["io_timeout_s"], deltas=deltas)


def _fed_round(c: BenchCluster, system: str, home: str, pool: list[str], frac: float) -> dict:
    """One version through the federation: publish at home, the gateway commits it in dc1, readers get it."""
    c.version += 1
    v = c.version
    c.trainer_digest = c.agents["trainer"].call("mutate_real", buf=BUF, step=v, frac=frac)["digest"]
    delta = system == FED_DELTA
    wan0 = wan_bytes(c, 1)
    pub = c.agents["trainer"].call("publish_delta" if delta else "publish", client=home, model="policy", version=v,
                                   buf=BUF, **({"delta_first": True} if delta else {}))
    gw = c.agents["gw"].call("gateway_wait", version=v, within=600)
    if gw["version"] != v:
        raise RuntimeError(f"gateway committed v{gw['version']}, not v{v}")
    cmd, buf = ("fetch_delta", DELTA_BUF) if delta else ("fetch", BUF)
    futs = {h: c.agents[h].submit(cmd, client=home + "1", model="policy", buf=buf) for h in pool}
    res = {h: f.result(900) for h, f in futs.items()}
    wan = wan_bytes(c, 1) - wan0
    c.agents["trainer"].call("release", client=home, model="policy", version=v)
    per = {h: r["t1"] - pub["t1"] for h, r in res.items()}
    exact = all(r["digest"] == c.trainer_digest and r["version"] == v for r in res.values())
    if not exact:
        log.error("%s v%d: a reader's bytes differ from the trainer's", system, v)
    return {"version": v, "wall_s": max(per.values()), "stall_s": sum(per.values()), "per_reader_s": per,
            "exact": exact, "wan_bytes": wan, "trainer_data_bytes": gw["cross_bytes"], "gateway_mode": gw["mode"],
            "gateway_s": round(gw["t"] - pub["t1"], 4), "delta_bytes": pub.get("delta_bytes", 0),
            "delta_base": pub.get("base"), "publish_delta_s": round(pub["t1"] - pub["t0"], 4),
            "encode_s": pub.get("encode_s", 0.0), "modes": sorted({r.get("mode", "full") for r in res.values()}),
            "phases": {h: r.get("phases") for h, r in res.items() if r.get("phases")}}


def _idle_rate(c: BenchCluster, seconds: float = 2.0) -> float:
    """Bytes per second entering dc1 while nothing happens but the gateway's polls (and heartbeats)."""
    c.wait_quiet()
    w0, t0 = wan_bytes(c, 1), time.monotonic()
    time.sleep(seconds)  # a measuring window, not a synchronisation
    return (wan_bytes(c, 1) - w0) / (time.monotonic() - t0)


def run_crossdc_delta_federated(cfg: BenchConfig, rollouts: int, dc_ratio: float, reps: int, frac: float,
                                one_hub: bool = True) -> dict:
    sp = fed_spec(rollouts, cfg.nic_rate, dc_ratio)
    systems = [FED_DELTA, FED_FULL] + ([ONE_HUB] if one_hub else [])
    rounds: dict[str, list[dict]] = {s: [] for s in systems}
    idle: dict[str, float] = {}
    planner = {**cfg.rlsync_planner(), "cross_dc_streams": 1}
    tiers = tier_gbps(parse_rate(cfg.nic_rate), sp.dc_link_rate_bps)
    with BenchCluster(sp, cfg) as c:
        pool = [h for h in c.readers if h.startswith("ro")]
        setup_bf16(c, ["trainer"] + pool)
        for system in systems:
            hub = {FED_DELTA: "fd", FED_FULL: "ff", ONE_HUB: "one"}[system]
            if system == ONE_HUB:
                c.start_hub(hub, planner, delta={"tier_gbps": tiers})
                join_clients(c, hub, ["trainer"] + pool)
            else:
                _start_fed(c, hub, planner, {"tier_gbps": tiers}, pool, deltas=system == FED_DELTA)
            for rep in range(reps + 1):        # rep 0: warm-up (every reader, and the gateway, then hold a version)
                c.wait_quiet()
                r = _fed_round(c, system, hub, pool, frac) if system != ONE_HUB else delta_round(c, "rlsync delta", hub,
                                                                                           pool, frac)
                log.info("rep %d %-26s v%d wall %.2fs stall %.2fs exact=%s modes=%s gw=%s delta=%d wan=%d", rep,
                         system, r["version"], r["wall_s"], r["stall_s"], r["exact"], r["modes"],
                         r.get("gateway_mode"), r["delta_bytes"], r["wan_bytes"])
                if rep:
                    rounds[system].append(r)
            if system != ONE_HUB:
                idle[system] = round(_idle_rate(c), 1)
                c.agents["gw"].call("gateway_stop")
            readers_client = hub if system == ONE_HUB else hub + "1"
            for h, client in [("trainer", hub)] + [(h, readers_client) for h in pool]:
                c.agents[h].call("leave", client=client)  # this system's clients go: the next one's own the buffers
        out = base_record("crossdc", c, cfg)
    out["config"].update(rollouts=rollouts, dc_link_rate_bps=sp.dc_link_rate_bps, reps=reps, delta=True,
                         federated=True, update_frac=frac, model_dtype="bfloat16", hub_tier_gbps=tiers)
    summary = summarize({"rlsync delta": rounds[FED_DELTA], "rlsync full": rounds[FED_FULL]},
                       out["config"]["model_bytes"])
    summary["total_stall_s_median"] = {s: median([r["stall_s"] for r in rs]) for s, rs in rounds.items()}
    summary["wall_s_median"] = {s: median([r["wall_s"] for r in rs]) for s, rs in rounds.items()}
    summary["rounds"] = rounds
    summary["exact"] = all(r["exact"] for rs in rounds.values() for r in rs)
    summary["gateway_modes"] = {s: sorted({r["gateway_mode"] for r in rounds[s]}) for s in (FED_DELTA, FED_FULL)}
    summary["idle_crossing_bytes_per_s"] = idle
    if one_hub:
        d = rounds[ONE_HUB]
        summary["crossing_bytes_per_delta_one_hub"] = round(max(r["wan_bytes"] / r["delta_bytes"] for r in d), 3)
    return out | summary
