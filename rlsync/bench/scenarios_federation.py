"""`python -m rlsync.bench fedcrossdc`: the crossdc workload with a hub per DC (hub/federation/gateway.py)
vs one hub for both DCs, on the same emulated topology in the same run.

    python -m rlsync.bench fedcrossdc --json outputs/bench/fedcrossdc.json

Topology: dc0 = {hub (the home hub), trainer}; dc1 = {hub1 (dc1's hub), gw (dc1's gateway), R rollout
workers} behind a DC link at `--dc-ratio` of the NIC rate (as `crossdc`). Each rep runs both systems
on a fresh version:
- one hub: the hub in dc0 plans every read (`cross_dc_streams=1`: the version crosses once, relays
  fan it out in dc1); readers start together `GO_DELAY_S` after the publish; stall from that instant.
- hub per DC: the trainer publishes to the home hub; the gateway (polling the home's latest) fetches
  it once across the DC link, publishes it to hub1 (the commit in dc1); dc1's readers, who know only
  hub1, start when it commits. Stall counted from the publish: it includes the gateway's poll, its
  cross-DC fetch and the commit — the cost of committing in dc1 only once dc1 holds every unit.
Bytes out of dc0 are the trainer's NIC counters (the only data source in dc0); every reader's bytes
are checked against the trainer's.
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from . import register_scenario
from .cluster import BenchCluster, BenchConfig, command_line, machine_info, skip_reason, write_outputs
from .scenarios_fanout import add_common_args, config_from
from .topo import TopologySpec, parse_rate

log = logging.getLogger(__name__)


def spec(rollouts: int, nic_rate: str, dc_ratio: float) -> TopologySpec:
    half = (rollouts + 1) // 2
    return TopologySpec.from_dict({
        "nic_rate": nic_rate, "dc_link_rate": int(parse_rate(nic_rate) * dc_ratio),
        "dcs": {"dc0": {"r0": ["hub", "trainer"]},
                "dc1": {k: v for k, v in {"r0": ["hub1", "gw"] + [f"ro{i}" for i in range(half)],
                                          "r1": [f"ro{i}" for i in range(half, rollouts)]}.items() if v}}})


def _tx(c: BenchCluster, host: str) -> int:
    import json
    r = c.topo.run(host, ["ip", "-j", "-s", "link", "show", "eth0"])
    return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]


def run(cfg: BenchConfig, rollouts: int, dc_ratio: float, reps: int) -> dict:
    sp = spec(rollouts, cfg.nic_rate, dc_ratio)
    planner = {**cfg.rlsync_planner(), "cross_dc_streams": 1}
    rows: dict[str, list[dict]] = {"one hub": [], "hub per DC": []}
    exact = True
    with BenchCluster(sp, cfg) as c:
        pool = [h for h in c.readers if h.startswith("ro")]
        for h in pool:  # the federated readers' own buffers (a replica of the other hub never shares them)
            c.agents[h].call("model", buf="wf", mib=cfg.model_mib, seed=cfg.seed, zero=True, bucket_mib=cfg.bucket_mib)
        c.check_links([("trainer", pool[0])], 4 << 20)
        c.start_hub("one", planner)
        c.start_hub("home", planner)
        c.hubs["dc1"] = c.agents["hub1"].call("hub_start", name="dc1", ip=c.topo.ip("hub1"), planner=planner)
        c.join_all("one", ["trainer"] + pool)
        c.join_all("home", ["trainer"])
        c.join_all("dc1", pool)
        g = c.join_args("home", "gw")
        c.agents["gw"].call("gateway_start", home=c.hubs["home"], local=c.hubs["dc1"], ip=g["ip"],
                            location=g["location"], transport=g["transport"], streams=g["streams"],
                            chunk_mib=g["chunk_mib"], io_timeout_s=g["io_timeout_s"])
        for rep in range(reps + 1):
            c.wait_quiet()
            tx0 = _tx(c, "trainer")
            r = c.hub_round("one", "one hub", pool)
            c.wait_quiet()
            one = {"per_reader_s": r.per_reader_s, "exact": r.exact, "copies_out_of_dc0": (_tx(c, "trainer") - tx0) / c.nbytes}
            exact &= r.exact
            tx0 = _tx(c, "trainer")
            fed = _federated_round(c, pool)
            c.wait_quiet()
            fed["copies_out_of_dc0"] = (_tx(c, "trainer") - tx0) / c.nbytes
            exact &= fed["exact"]
            log.info("rep %d: one hub stall %.2fs, hub per DC %.2fs (gateway %.2fs)", rep,
                     sum(one["per_reader_s"].values()), sum(fed["per_reader_s"].values()), fed["gateway_s"])
            if rep:
                rows["one hub"].append(one)
                rows["hub per DC"].append(fed)
        c.agents["gw"].call("gateway_stop")
        out = {"scenario": "fedcrossdc", "machine": machine_info(), "command": command_line(),
               "config": {"model_bytes": c.nbytes, "nic_rate": cfg.nic_rate, "chunk_mib": cfg.chunk_mib,
                          "rollouts": rollouts, "dc_link_rate_bps": sp.dc_link_rate_bps, "reps": reps,
                          "transport": c.transport, "planner": planner},
               "link_check_mbit": c.link_check}
    out["ideal_one_dc_crossing_s"] = round(out["config"]["model_bytes"] * 8 / sp.dc_link_rate_bps, 3)
    summary = {}
    for s, rs in rows.items():
        stall = sorted(sum(x["per_reader_s"].values()) for x in rs)
        summary[s] = {"total_stall_s_median": stall[len(stall) // 2],
                      "last_reader_s_median": sorted(max(x["per_reader_s"].values()) for x in rs)[len(rs) // 2],
                      "copies_out_of_dc0": [round(x["copies_out_of_dc0"], 3) for x in rs]}
    summary["hub per DC"]["gateway_s"] = [round(x["gateway_s"], 3) for x in rows["hub per DC"]]
    out.update({"systems": summary, "runs": rows, "exact": exact,
                "stall_hub_per_dc_vs_one_hub": round(summary["hub per DC"]["total_stall_s_median"]
                                                     / summary["one hub"]["total_stall_s_median"], 3)})
    return out


def _federated_round(c: BenchCluster, pool: list[str]) -> dict:
    v = c.new_version()
    t_pub = c.publish("home", v)
    gw = c.agents["gw"].call("gateway_wait", version=v, timeout=600)
    if gw["version"] != v:
        raise RuntimeError(f"gateway committed v{gw['version']}, not v{v}")
    go = time.monotonic()
    futs = {h: c.agents[h].submit("fetch", client="dc1", model="policy", buf="wf", at=go) for h in pool}
    res = {h: f.result(600) for h, f in futs.items()}
    c.release("home", v)
    ok = all(r["digest"] == c.trainer_digest and r["version"] == v for r in res.values())
    if not ok:
        log.error("hub per DC: a reader's bytes differ from the trainer's")
    return {"per_reader_s": {h: r["t1"] - t_pub for h, r in res.items()}, "exact": ok,
            "gateway_s": gw["t"] - t_pub, "gateway_cross_bytes": gw["cross_bytes"], "go_after_publish_s": go - t_pub,
            "sources": {h: r["bytes_by_source"] for h, r in res.items()}}


def print_summary(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    cfg = res["config"]
    t = Table(title=f"fedcrossdc: {cfg['model_bytes'] / 2**20:.0f} MiB, {cfg['rollouts']} readers in dc1, DC link "
                    f"{cfg['dc_link_rate_bps'] / 1e6:.0f} Mbit/s (one crossing = {res['ideal_one_dc_crossing_s']:.2f}s)")
    for col in ("system", "total stall of dc1's readers (s)", "last reader (s)", "copies out of dc0", "gateway (s)"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for s, v in res["systems"].items():
        t.add_row(s, f"{v['total_stall_s_median']:.2f}", f"{v['last_reader_s_median']:.2f}",
                  ", ".join(f"{x:.2f}" for x in v["copies_out_of_dc0"]), ", ".join(f"{x:.2f}" for x in v.get("gateway_s", [])))
    Console(width=140).print(t)
    print(f"hub per DC / one hub (stall): {res['stall_hub_per_dc_vs_one_hub']}x; exact={res['exact']}; "
          f"elapsed {res.get('elapsed_s')} s")


def plot(res: dict, path: Path) -> None:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3))
    names = list(res["systems"])
    ax.bar(names, [res["systems"][n]["total_stall_s_median"] for n in names])
    ax.set_ylabel("total stall of dc1's readers (s)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@register_scenario("fedcrossdc")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench fedcrossdc", description=__doc__.split("\n")[0])
    add_common_args(p, 8.0)
    p.add_argument("--rollouts", type=int, default=8, help="rollout workers in dc1")
    p.add_argument("--dc-ratio", type=float, default=0.1, help="DC link rate / host NIC rate")
    p.add_argument("--reps", type=int, default=1)
    p.set_defaults(fanout_cap=4)  # as crossdc: fast NICs behind a slow DC link make a shallow tree
    a = p.parse_args(argv)
    why = skip_reason()
    if why:
        print(f"fedcrossdc: cannot run: {why}")
        return 2
    t0 = time.monotonic()
    res = run(config_from(a), a.rollouts, a.dc_ratio, a.reps)
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    print_summary(res)
    write_outputs(res, a.json, plot)
    return 0
