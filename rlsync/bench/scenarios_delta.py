"""`crossdc --delta` and `elastic --delta`: readers that hold the previous version pull only its delta.

    python -m rlsync.bench crossdc --delta --json outputs/bench/crossdc_delta.json
    python -m rlsync.bench elastic --delta --json outputs/bench/elastic_delta.json

Every host holds a bf16 model (`model_bf16`); the trainer's optimizer step is `mutate_real` (the
share of bf16 elements a SmolLM2-135M AdamW step changes, docs/deltas.md), so consecutive versions
differ as real ones do. Each system runs its own phase of consecutive versions in one run, on the
same topology: a warm-up round (untimed; every reader then holds a version) and `--reps` timed rounds.

- crossdc: the trainer in dc0, R readers in dc1 behind the DC link. Systems: `rlsync delta` (the
  trainer publishes v and its delta; each reader `fetch_delta`s: the hub chooses per reader, with its
  link rates set to the emulated ones), `rlsync full` (today: every reader fetches v in full; the
  version crosses once), `per-worker pull` (every reader pulls v from the trainer). Stall = the sum
  of the readers' waits. Also per delta round: the bytes that entered dc1 over the DC link (its veth's
  kernel counter: data, control RPCs and TCP/IP headers) and the data-plane bytes dc0 served, each
  divided by the encoded delta size (`crossing_bytes_per_delta`, `crossing_data_bytes_per_delta`).
- elastic: m holders follow every version; k stale workers hold a version `--behind` versions old
  and catch up at once: by a chain of deltas (`rlsync delta`) or in full (`rlsync full`). Time from
  the shared start to the last one holding the latest.
"""
from __future__ import annotations

import json
import logging
import subprocess
import time

from .cluster import GO_DELAY_S, BenchCluster, BenchConfig
from .scenarios_fanout import fanout_spec
from .scenarios_workloads import P2P_PLANNER, _base, crossdc_spec
from .topo import parse_rate

log = logging.getLogger(__name__)
BUF = "b"   # every system's bf16 buffer on a reader; the delta system's own buffer is "bd"
DELTA_BUF = "bd"


def _tier_gbps(nic_bps: float, dc_bps: float | None) -> list[float]:
    """The hub's assumed link rates (Gbit/s) = the emulated ones: NICs inside a DC, the DC link across."""
    nic = nic_bps / 1e9
    return [nic, nic, nic, (dc_bps or nic_bps) / 1e9]


def _setup(c: BenchCluster, hosts: list[str]) -> None:
    futs = [c.agents[h].submit("model_bf16", buf=b, mib=c.cfg.model_mib, seed=c.cfg.seed, zero=h != "trainer")
            for h in hosts for b in ((BUF,) if h == "trainer" else (BUF, DELTA_BUF))]
    info = [f.result(300) for f in futs]
    c.nbytes = info[0]["nbytes"]


def _wan_bytes(c: BenchCluster, dc_index: int) -> int:
    """Bytes that entered DC `dc_index` over its DC link (tx of the WAN bridge's port toward it)."""
    r = subprocess.run(["ip", "-n", c.topo.fabric, "-j", "-s", "link", "show", f"wan-d{dc_index}"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)[0]["stats64"]["tx"]["bytes"]


def _round(c: BenchCluster, system: str, hub: str, readers: list[str], frac: float,
           joining: bool = False) -> dict:
    """One version: the trainer steps and publishes (and its delta), `readers` get it at one instant."""
    c.version += 1
    v = c.version
    c.trainer_digest = c.agents["trainer"].call("mutate_real", buf=BUF, step=v, frac=frac)["digest"]
    delta = system == "rlsync delta"
    pub = c.agents["trainer"].call("publish_delta" if delta else "publish", client=hub, model="policy",
                                   version=v, buf=BUF)
    wan0 = _wan_bytes(c, 1) if len(c.spec.dcs) > 1 else 0
    go = time.monotonic() + GO_DELAY_S
    cmd = "fetch_delta" if delta else "fetch"
    buf = DELTA_BUF if delta else BUF
    futs = {h: c.agents[h].submit(cmd, client=hub, model="policy", buf=buf, at=go) for h in readers}
    res = {h: f.result(900) for h, f in futs.items()}
    wan = (_wan_bytes(c, 1) - wan0) if len(c.spec.dcs) > 1 else 0
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


def _join(c: BenchCluster, hub: str, hosts: list[str]) -> None:
    futs = {h: c.agents[h].submit("join", **c.join_args(hub, h)) for h in hosts}
    c.wids = getattr(c, "wids", {})
    c.wids.setdefault(hub, {}).update({h: f.result(60) for h, f in futs.items()})


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def run_crossdc_delta(cfg: BenchConfig, rollouts: int, dc_ratio: float, reps: int, frac: float,
                      skip_p2p: bool = False) -> dict:
    spec = crossdc_spec(rollouts, cfg.nic_rate, dc_ratio)
    systems = ["rlsync delta", "rlsync full"] + ([] if skip_p2p else ["per-worker pull"])
    rounds: dict[str, list[dict]] = {s: [] for s in systems}
    with BenchCluster(spec, cfg) as c:
        pool = c.readers
        _setup(c, ["trainer"] + pool)
        planner = {**cfg.rlsync_planner(), "cross_dc_streams": 1}
        tiers = _tier_gbps(parse_rate(cfg.nic_rate), spec.dc_link_rate_bps)
        c.start_hub("delta", planner, delta={"tier_gbps": tiers})
        c.start_hub("full", planner)
        if not skip_p2p:
            c.start_hub("p2p", P2P_PLANNER, only_hosts=["trainer"])
        for system, hub in zip(systems, ("delta", "full", "p2p")):
            _join(c, hub, ["trainer"] + pool)
            for rep in range(reps + 1):        # rep 0: warm-up (every reader then holds a version)
                c.wait_quiet()
                r = _round(c, system, hub, pool, frac)
                log.info("rep %d %-16s v%d wall %.2fs stall %.2fs exact=%s modes=%s delta=%d wan=%d", rep, system,
                         r["version"], r["wall_s"], r["stall_s"], r["exact"], r["modes"], r["delta_bytes"],
                         r["wan_bytes"])
                if rep:
                    rounds[system].append(r)
        out = _base("crossdc", c, cfg)
    out["config"].update(rollouts=rollouts, dc_link_rate_bps=spec.dc_link_rate_bps, reps=reps, delta=True,
                         update_frac=frac, model_dtype="bfloat16", hub_tier_gbps=tiers)
    return out | _summary(rounds, out["config"]["model_bytes"])


def _summary(rounds: dict[str, list[dict]], model_bytes: int) -> dict:
    stall = {s: _median([r["stall_s"] for r in rs]) for s, rs in rounds.items()}
    wall = {s: _median([r["wall_s"] for r in rs]) for s, rs in rounds.items()}
    d = rounds["rlsync delta"]
    out = {"total_stall_s_median": stall, "wall_s_median": wall, "rounds": rounds,
           "exact": all(r["exact"] for rs in rounds.values() for r in rs),
           "delta_modes": sorted({m for r in d for m in r["modes"]}),
           "delta_bytes_per_version": _median([r["delta_bytes"] for r in d]),
           "delta_ratio_to_full": round(_median([r["delta_bytes"] for r in d]) / model_bytes, 4),
           "speedup_delta_vs_full": round(stall["rlsync full"] / stall["rlsync delta"], 3),
           "wall_speedup_delta_vs_full": round(wall["rlsync full"] / wall["rlsync delta"], 3),
           "publish_delta_s_median": _median([r["publish_delta_s"] for r in d])}
    if any(r["wan_bytes"] for r in d):
        out["crossing_bytes_per_delta"] = round(max(r["wan_bytes"] / r["delta_bytes"] for r in d), 3)
        out["crossing_data_bytes_per_delta"] = round(max(r["trainer_data_bytes"] / r["delta_bytes"] for r in d), 3)
    if "per-worker pull" in stall:
        out["speedup_delta_vs_per_worker_pull"] = round(stall["per-worker pull"] / stall["rlsync delta"], 3)
        out["speedup_full_vs_per_worker_pull"] = round(stall["per-worker pull"] / stall["rlsync full"], 3)
    return out


def run_elastic_delta(cfg: BenchConfig, holders: int, joiners: int, reps: int, behind: int, frac: float) -> dict:
    spec = fanout_spec(holders + joiners, cfg.nic_rate)
    times: dict[str, list[float]] = {"rlsync delta": [], "rlsync full": []}
    info: dict[str, list[dict]] = {"rlsync delta": [], "rlsync full": []}
    exact = True
    with BenchCluster(spec, cfg) as c:
        hold, stale = c.readers[:holders], c.readers[holders:]
        _setup(c, ["trainer"] + c.readers)
        tiers = _tier_gbps(parse_rate(cfg.nic_rate), None)
        c.start_hub("delta", cfg.rlsync_planner(), delta={"tier_gbps": tiers})
        c.start_hub("full", cfg.rlsync_planner())
        for system, hub in (("rlsync delta", "delta"), ("rlsync full", "full")):
            _join(c, hub, ["trainer"] + c.readers)
            _round(c, system, hub, c.readers, frac)          # everyone holds a version
            for rep in range(reps + 1):
                for _ in range(behind):                       # the stale workers miss `behind` versions
                    c.wait_quiet()
                    _round(c, system, hub, hold, frac)
                c.wait_quiet()
                go = time.monotonic() + GO_DELAY_S
                cmd, buf = ("fetch_delta", DELTA_BUF) if system == "rlsync delta" else ("fetch", BUF)
                futs = {h: c.agents[h].submit(cmd, client=hub, model="policy", buf=buf, at=go) for h in stale}
                res = {h: f.result(900) for h, f in futs.items()}
                ok = all(r["digest"] == c.trainer_digest and r["version"] == c.version for r in res.values())
                exact &= ok
                secs = max(r["t1"] - go for r in res.values())
                log.info("rep %d %-13s %d stale (%d behind): %.2fs exact=%s modes=%s", rep, system, len(stale),
                         behind, secs, ok, sorted({r.get("mode", "full") for r in res.values()}))
                if rep:
                    times[system].append(secs)
                    info[system].append({"seconds": secs, "modes": sorted({r.get("mode", "full") for r in res.values()}),
                                         "bytes": sum(r.get("nbytes", 0) for r in res.values()),
                                         "per_worker_s": {h: round(r["t1"] - go, 3) for h, r in res.items()},
                                         "phases": {h: r.get("phases") for h, r in res.items() if r.get("phases")}})
        out = _base("elastic", c, cfg)
    med = {s: _median(v) for s, v in times.items()}
    out["config"].update(holders=holders, joiners=joiners, reps=reps, behind=behind, delta=True, update_frac=frac,
                         model_dtype="bfloat16", hub_tier_gbps=tiers)
    out.update({"seconds_median": med, "seconds_runs": times, "rounds": info, "exact": exact,
                "speedup_delta_vs_full": round(med["rlsync full"] / med["rlsync delta"], 3)})
    return out
