"""The round helpers of the delta workloads (`crossdc --delta`, `elastic --delta`, `crossdc --delta
--federated`): bf16 models on every host, one version's round (the trainer steps, publishes v and its
delta, the readers get it at one instant), the DC link's byte counter, and the summary of the rounds.
"""
from __future__ import annotations

import json
import logging
import subprocess
import time

from .agent.protocol import GO_DELAY_S
from .cluster import BenchCluster

log = logging.getLogger(__name__)
BUF = "b"   # every system's bf16 buffer on a reader; the delta system's own buffer is "bd"
DELTA_BUF = "bd"


def tier_gbps(nic_bps: float, dc_bps: float | None) -> list[float]:
    """The hub's assumed link rates (Gbit/s) = the emulated ones: NICs inside a DC, the DC link across."""
    nic = nic_bps / 1e9
    return [nic, nic, nic, (dc_bps or nic_bps) / 1e9]


def setup_bf16(c: BenchCluster, hosts: list[str]) -> None:
    """A bf16 model on every host: the trainer's in BUF, a reader's in BUF and DELTA_BUF (zeros)."""
    futs = [c.agents[h].submit("model_bf16", buf=b, mib=c.cfg.model_mib, seed=c.cfg.seed, zero=h != "trainer")
            for h in hosts for b in ((BUF,) if h == "trainer" else (BUF, DELTA_BUF))]
    info = [f.result(300) for f in futs]
    c.nbytes = info[0]["nbytes"]


def wan_bytes(c: BenchCluster, dc_index: int) -> int:
    """Bytes that entered DC `dc_index` over its DC link (tx of the WAN bridge's port toward it)."""
    r = subprocess.run(["ip", "-n", c.topo.fabric, "-j", "-s", "link", "show", f"wan-d{dc_index}"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]


def delta_round(c: BenchCluster, system: str, hub: str, readers: list[str], frac: float,
                joining: bool = False) -> dict:
    """One version: the trainer steps and publishes (and its delta), `readers` get it at one instant."""
    c.version += 1
    v = c.version
    c.trainer_digest = c.agents["trainer"].call("mutate_real", buf=BUF, step=v, frac=frac)["digest"]
    delta = system == "rlsync delta"
    pub = c.agents["trainer"].call("publish_delta" if delta else "publish", client=hub, model="policy",
                                   version=v, buf=BUF)
    wan0 = wan_bytes(c, 1) if len(c.spec.dcs) > 1 else 0
    go = time.monotonic() + GO_DELAY_S
    cmd = "fetch_delta" if delta else "fetch"
    buf = DELTA_BUF if delta else BUF
    futs = {h: c.agents[h].submit(cmd, client=hub, model="policy", buf=buf, at=go) for h in readers}
    res = {h: f.result(900) for h, f in futs.items()}
    wan = (wan_bytes(c, 1) - wan0) if len(c.spec.dcs) > 1 else 0
    c.agents["trainer"].call("release", client=hub, model="policy", version=v)
    per = {h: r["t1"] - go for h, r in res.items()}
    exact = all(r["digest"] == c.trainer_digest for r in res.values())
    if not exact:
        log.error("%s v%d: a reader's bytes differ from the trainer's", system, v)
    from_trainer = sum(r["bytes_by_source"].get(k, 0) for r in res.values() for k in r["bytes_by_source"]
                       if k == _trainer_wid(c, hub))
    return {"version": v, "wall_s": max(per.values()), "stall_s": sum(per.values()), "per_reader_s": per,
            "exact": exact, "wan_bytes": wan, "trainer_data_bytes": from_trainer,
            "delta_bytes": pub.get("delta_bytes", 0), "delta_base": pub.get("base"),
            "publish_delta_s": round(pub.get("t2", pub["t1"]) - pub["t1"], 4), "encode_s": pub.get("encode_s", 0.0),
            "modes": sorted({r.get("mode", "full") for r in res.values()}),
            "phases": {h: r.get("phases") for h, r in res.items() if r.get("phases")}}


def _trainer_wid(c: BenchCluster, hub: str) -> str:
    return c.wids[hub]["trainer"]


def join_clients(c: BenchCluster, hub: str, hosts: list[str]) -> None:
    """Join `hosts` to hub `hub` at once; their worker ids go to `c.wids[hub]`."""
    futs = {h: c.agents[h].submit("join", **c.join_args(hub, h)) for h in hosts}
    c.wids = getattr(c, "wids", {})
    c.wids.setdefault(hub, {}).update({h: f.result(60) for h, f in futs.items()})


def median(xs: list[float]) -> float:
    """The upper median (an element of `xs`): [1, 3, 2] -> 2, [1, 2, 3, 4] -> 3."""
    return sorted(xs)[len(xs) // 2]


def summarize(rounds: dict[str, list[dict]], model_bytes: int) -> dict:
    """Medians over the timed rounds of "rlsync delta" and "rlsync full" (and "per-worker pull" if run):
    stall and wall speedups, the delta's size against the model, and the DC link's bytes per delta byte
    (worst round)."""
    stall = {s: median([r["stall_s"] for r in rs]) for s, rs in rounds.items()}
    wall = {s: median([r["wall_s"] for r in rs]) for s, rs in rounds.items()}
    d = rounds["rlsync delta"]
    out = {"total_stall_s_median": stall, "wall_s_median": wall, "rounds": rounds,
           "exact": all(r["exact"] for rs in rounds.values() for r in rs),
           "delta_modes": sorted({m for r in d for m in r["modes"]}),
           "delta_bytes_per_version": median([r["delta_bytes"] for r in d]),
           "delta_ratio_to_full": round(median([r["delta_bytes"] for r in d]) / model_bytes, 4),
           "speedup_delta_vs_full": round(stall["rlsync full"] / stall["rlsync delta"], 3),
           "wall_speedup_delta_vs_full": round(wall["rlsync full"] / wall["rlsync delta"], 3),
           "publish_delta_s_median": median([r["publish_delta_s"] for r in d])}
    if any(r["wan_bytes"] for r in d):
        out["crossing_bytes_per_delta"] = round(max(r["wan_bytes"] / r["delta_bytes"] for r in d), 3)
        out["crossing_data_bytes_per_delta"] = round(max(r["trainer_data_bytes"] / r["delta_bytes"] for r in d), 3)
    if "per-worker pull" in stall:
        out["speedup_delta_vs_per_worker_pull"] = round(stall["per-worker pull"] / stall["rlsync delta"], 3)
        out["speedup_full_vs_per_worker_pull"] = round(stall["per-worker pull"] / stall["rlsync full"], 3)
    return out
