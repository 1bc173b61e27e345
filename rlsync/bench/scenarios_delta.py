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

import logging
import time

from .agent.protocol import GO_DELAY_S
from .cluster import BenchCluster, BenchConfig
from .delta_rounds import BUF, DELTA_BUF, delta_round, join_clients, median, setup_bf16, summarize, tier_gbps
from .scenarios_fanout import fanout_spec
from .topo import parse_rate
from .workload_specs import P2P_PLANNER, base_record, crossdc_spec

log = logging.getLogger(__name__)


def run_crossdc_delta(cfg: BenchConfig, rollouts: int, dc_ratio: float, reps: int, frac: float,
                      skip_p2p: bool = False) -> dict:
    spec = crossdc_spec(rollouts, cfg.nic_rate, dc_ratio)
    systems = ["rlsync delta", "rlsync full"] + ([] if skip_p2p else ["per-worker pull"])
    rounds: dict[str, list[dict]] = {s: [] for s in systems}
    with BenchCluster(spec, cfg) as c:
        pool = c.readers
        setup_bf16(c, ["trainer"] + pool)
        planner = {**cfg.rlsync_planner(), "cross_dc_streams": 1}
        tiers = tier_gbps(parse_rate(cfg.nic_rate), spec.dc_link_rate_bps)
        c.start_hub("delta", planner, delta={"tier_gbps": tiers})
        c.start_hub("full", planner)
        if not skip_p2p:
            c.start_hub("p2p", P2P_PLANNER, only_hosts=["trainer"])
        for system, hub in zip(systems, ("delta", "full", "p2p")):
            join_clients(c, hub, ["trainer"] + pool)
            for rep in range(reps + 1):        # rep 0: warm-up (every reader then holds a version)
                c.wait_quiet()
                r = delta_round(c, system, hub, pool, frac)
                log.info("rep %d %-16s v%d wall %.2fs stall %.2fs exact=%s modes=%s delta=%d wan=%d", rep, system,
                         r["version"], r["wall_s"], r["stall_s"], r["exact"], r["modes"], r["delta_bytes"],
                         r["wan_bytes"])
                if rep:
                    rounds[system].append(r)
        out = base_record("crossdc", c, cfg)
    out["config"].update(rollouts=rollouts, dc_link_rate_bps=spec.dc_link_rate_bps, reps=reps, delta=True,
                         update_frac=frac, model_dtype="bfloat16", hub_tier_gbps=tiers)
    return out | summarize(rounds, out["config"]["model_bytes"])


def run_elastic_delta(cfg: BenchConfig, holders: int, joiners: int, reps: int, behind: int, frac: float) -> dict:
    spec = fanout_spec(holders + joiners, cfg.nic_rate)
    times: dict[str, list[float]] = {"rlsync delta": [], "rlsync full": []}
    info: dict[str, list[dict]] = {"rlsync delta": [], "rlsync full": []}
    exact = True
    with BenchCluster(spec, cfg) as c:
        hold, stale = c.readers[:holders], c.readers[holders:]
        setup_bf16(c, ["trainer"] + c.readers)
        tiers = tier_gbps(parse_rate(cfg.nic_rate), None)
        c.start_hub("delta", cfg.rlsync_planner(), delta={"tier_gbps": tiers})
        c.start_hub("full", cfg.rlsync_planner())
        for system, hub in (("rlsync delta", "delta"), ("rlsync full", "full")):
            join_clients(c, hub, ["trainer"] + c.readers)
            delta_round(c, system, hub, c.readers, frac)          # everyone holds a version
            for rep in range(reps + 1):
                for _ in range(behind):                       # the stale workers miss `behind` versions
                    c.wait_quiet()
                    delta_round(c, system, hub, hold, frac)
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
        out = base_record("elastic", c, cfg)
    med = {s: median(v) for s, v in times.items()}
    out["config"].update(holders=holders, joiners=joiners, reps=reps, behind=behind, delta=True, update_frac=frac,
                         model_dtype="bfloat16", hub_tier_gbps=tiers)
    out.update({"seconds_median": med, "seconds_runs": times, "rounds": info, "exact": exact,
                "speedup_delta_vs_full": round(med["rlsync full"] / med["rlsync delta"], 3)})
    return out
