"""The paper's three workloads on an emulated topology: `standalone`, `elastic`, `crossdc`.

    python -m rlsync.bench standalone --json outputs/bench/standalone.json
    python -m rlsync.bench elastic    --json outputs/bench/elastic.json
    python -m rlsync.bench crossdc    --json outputs/bench/crossdc.json

Models of each (what counts as stall, what overlaps) — compute is simulated (sleeps), transfers are
real processes moving real bytes over the shaped links, checked bit-for-bit:

- standalone: a trainer makes a version every step; a fixed pool of R rollout workers must hold it
  before generating. Stall = the time a worker is blocked on weight sync: a rollout worker from the
  instant the version exists until it holds it; the trainer until it may write its weights again.
  gloo broadcast (NCCL's shape): trainer and pool enter one broadcast together, all blocked for
  its length (each until its own part ends). rlsync: the trainer publishes (no copy) and keeps
  training (`--train-s`) while the pool fetches; before its next optimizer write it `release`s, and
  any wait there is its stall. A worker generates (`--gen-s`) only after fetching; the next step's
  fetch never starts before a worker finished generating, so no transfer overlaps generation.
  The trainer is a group of `--trainer-gpus` ranks; rank 0 (the agent in the trainer's namespace)
  broadcasts or publishes, and the others wait for it at the group's next collective, so each
  stalls as long as rank 0's measured stall. `speedup_vs_gloo_broadcast` = gloo's total GPU stall
  (trainer group + pool, summed over steps) / rlsync's: the paper's metric. Also reported:
  `rollout_stall_speedup_vs_gloo_broadcast` (the pool's stall only) and
  `speedup_vs_gloo_broadcast_one_trainer_gpu` (a one-rank trainer).
- elastic: m workers already hold the version; k new workers join and fetch it at once. Figure:
  time from the joins until the last joiner holds it (join RPC included). Baseline: trainer-only
  point-to-point (UCX's shape: every joiner pulls from the trainer). `speedup_vs_p2p`.
- crossdc: the trainer in dc0, R rollout workers in dc1 behind a DC link at 1/10 of the host NIC
  rate. All fetch a fresh version at once; total stall = the sum of their waits. Baseline: each
  worker pulls from the trainer across the DC link (per-worker pull). rlsync crosses once
  (`cross_dc_streams=1`) and relays inside dc1. `speedup_vs_per_worker_pull`.
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from . import register_scenario
from .cluster import BenchCluster, BenchConfig, skip_reason, write_outputs
from .scenarios_delta import run_crossdc_delta, run_elastic_delta
from .scenarios_fanout import add_common_args, config_from, fanout_spec
from .scenarios_fed_delta import run_crossdc_delta_federated
from .workload_specs import P2P_PLANNER, base_record, crossdc_spec

log = logging.getLogger(__name__)

TRAINER_GPUS = 16
"""standalone's trainer group: a 32-GPU job split evenly with the 16-worker rollout pool."""


# ---------------------------------------------------------------- standalone
def run_standalone(cfg: BenchConfig, rollouts: int, steps: int, train_s: float, gen_s: float,
                   trainer_gpus: int = TRAINER_GPUS) -> dict:
    spec = fanout_spec(rollouts, cfg.nic_rate)
    with BenchCluster(spec, cfg) as c:
        pool = c.readers
        c.start_hub("rlsync", cfg.rlsync_planner())
        c.join_all("rlsync", ["trainer"] + pool)
        c.gloo_init({"pool": pool})
        c.hub_round("rlsync", "warm-up", pool)
        c.gloo_round("pool")
        exact = True
        # gloo: one broadcast per step; everyone blocked from `go` to the end of their part.
        gloo_steps = []
        c.wait_quiet()
        for step in range(steps):
            r, trainer = c.gloo_round("pool")
            exact &= r.exact
            gloo_steps.append({"rollout_stall_s": r.per_reader_s, "trainer_stall_s": trainer["t1"] - trainer["t0"]})
            # Training and generation run after the broadcast, in parallel; nothing to overlap with.
        # rlsync: publish, the pool fetches while the trainer trains, release before the next write.
        rl_steps = []
        ready_at = {h: 0.0 for h in pool}  # when each worker finished generating the last batch
        c.wait_quiet()
        for step in range(steps):
            v = c.new_version()
            c.publish("rlsync", v)
            go = max([time.monotonic() + 0.3] + list(ready_at.values()))
            futs = {h: c.agents[h].submit("fetch", client="rlsync", model="policy", buf="w", at=go) for h in pool}
            time.sleep(max(0.0, go + train_s - time.monotonic()))  # the trainer's next step (simulated)
            rel = c.release("rlsync", v)  # before the optimizer writes: waits for in-flight reads
            res = {h: f.result(600) for h, f in futs.items()}
            r = c.round_from("rlsync", go, res)
            exact &= r.exact
            for h, x in res.items():
                ready_at[h] = x["t1"] + gen_s
            rl_steps.append({"rollout_stall_s": r.per_reader_s, "trainer_stall_s": rel["t1"] - rel["t0"]})
        out = base_record("standalone", c, cfg)

    # The trainer group's other ranks wait for rank 0 at the group's next collective, so each
    # stalls exactly as long as rank 0's measured stall: counted `trainer_gpus` times.
    def rollout(st):
        return sum(sum(s["rollout_stall_s"].values()) for s in st)

    def trainer(st):
        return sum(s["trainer_stall_s"] for s in st)

    def ratio(a, b):
        return round(a / b, 3) if b > 0 else None

    systems = {}
    for name, st in (("gloo broadcast", gloo_steps), ("rlsync", rl_steps)):
        ro, tr = rollout(st), trainer(st)
        systems[name] = {"total_stall_s": round(ro + trainer_gpus * tr, 3), "rollout_stall_s": round(ro, 3),
                         "trainer_rank0_stall_s": round(tr, 3), "total_stall_one_trainer_gpu_s": round(ro + tr, 3),
                         "steps": st}
    g, rl = systems["gloo broadcast"], systems["rlsync"]
    out["config"].update(rollouts=rollouts, steps=steps, train_s=train_s, gen_s=gen_s, trainer_gpus=trainer_gpus)
    out.update({
        "systems": systems,
        "exact": exact,
        # The paper's metric: total GPU stall of the job (trainer group + rollout pool).
        "speedup_vs_gloo_broadcast": ratio(g["total_stall_s"], rl["total_stall_s"]),
        # The same with the rollout pool's stall only, and with a one-GPU trainer.
        "rollout_stall_speedup_vs_gloo_broadcast": ratio(g["rollout_stall_s"], rl["rollout_stall_s"]),
        "speedup_vs_gloo_broadcast_one_trainer_gpu": ratio(g["total_stall_one_trainer_gpu_s"],
                                                           rl["total_stall_one_trainer_gpu_s"]),
    })
    return out


# ---------------------------------------------------------------- elastic
def run_elastic(cfg: BenchConfig, holders: int, joiners: int, reps: int) -> dict:
    spec = fanout_spec(holders + joiners, cfg.nic_rate)
    times = {"rlsync": [], "trainer-only p2p": []}
    exact = True
    with BenchCluster(spec, cfg) as c:
        hold, join = c.readers[:holders], c.readers[holders:]
        c.start_hub("rlsync", cfg.rlsync_planner())
        c.start_hub("p2p", P2P_PLANNER, only_hosts=["trainer"])
        per_reader = {}
        for rep in range(reps + 1):  # round 0: warm-up, untimed
            for system, hub in (("rlsync", "rlsync"), ("trainer-only p2p", "p2p")):
                c.wait_quiet()
                c.join_all(hub, ["trainer"] + hold)
                v = c.new_version()
                c.publish(hub, v)
                c.fetch_all(hub, hold)  # the m holders already have it
                go, res = c.fetch_all(hub, join, joining=True)
                r = c.round_from(system, go, res)
                exact &= r.exact
                futs = [c.agents[h].submit("leave", client=hub) for h in ["trainer"] + hold + join]
                for f in futs:
                    f.result(60)
                if rep:
                    times[system].append(r.seconds)
                    per_reader[system] = r.per_reader_s
                log.info("rep %d %-18s %d joiners: %.2fs exact=%s", rep, system, len(join), r.seconds, r.exact)
        out = base_record("elastic", c, cfg)
    med = {s: sorted(v)[len(v) // 2] for s, v in times.items()}
    out["config"].update(holders=holders, joiners=joiners, reps=reps)
    out.update({"seconds_median": med, "seconds_runs": times, "per_joiner_s_last_rep": per_reader,
                "exact": exact, "speedup_vs_p2p": round(med["trainer-only p2p"] / med["rlsync"], 3)})
    return out


# ---------------------------------------------------------------- crossdc
def run_crossdc(cfg: BenchConfig, rollouts: int, dc_ratio: float, reps: int) -> dict:
    spec = crossdc_spec(rollouts, cfg.nic_rate, dc_ratio)
    stall = {"rlsync": [], "per-worker pull": []}
    wall = {"rlsync": [], "per-worker pull": []}
    exact = True
    with BenchCluster(spec, cfg) as c:
        pool = c.readers
        c.check_links([("trainer", pool[0]), (pool[0], pool[-1])], 4 << 20)
        c.start_hub("rlsync", {**cfg.rlsync_planner(), "cross_dc_streams": 1})
        c.start_hub("p2p", P2P_PLANNER, only_hosts=["trainer"])
        c.join_all("rlsync", ["trainer"] + pool)
        c.join_all("p2p", ["trainer"] + pool)
        last = {}
        for rep in range(reps + 1):
            for system, hub in (("rlsync", "rlsync"), ("per-worker pull", "p2p")):
                c.wait_quiet()
                r = c.hub_round(hub, system, pool)
                exact &= r.exact
                log.info("rep %d %-16s wall %.2fs total stall %.2fs exact=%s", rep, system, r.seconds,
                         sum(r.per_reader_s.values()), r.exact)
                if rep:
                    stall[system].append(sum(r.per_reader_s.values()))
                    wall[system].append(r.seconds)
                    last[system] = {"per_reader_s": r.per_reader_s, "sources": r.sources}
        out = base_record("crossdc", c, cfg)
        out["link_check_mbit"] = c.link_check
    med = {s: sorted(v)[len(v) // 2] for s, v in stall.items()}
    medw = {s: sorted(v)[len(v) // 2] for s, v in wall.items()}
    out["config"].update(rollouts=rollouts, dc_link_rate_bps=spec.dc_link_rate_bps, reps=reps)
    out["ideal_one_dc_crossing_s"] = round(out["config"]["model_bytes"] * 8 / spec.dc_link_rate_bps, 3)
    out.update({"total_stall_s_median": med, "wall_s_median": medw, "total_stall_runs": stall,
                "last_rep": last, "exact": exact,
                "speedup_vs_per_worker_pull": round(med["per-worker pull"] / med["rlsync"], 3),
                "wall_speedup_vs_per_worker_pull": round(medw["per-worker pull"] / medw["rlsync"], 3)})
    return out


# ---------------------------------------------------------------- tables and plots
def print_summary(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    name = res["scenario"]
    cfg = res["config"]
    t = Table(title=f"{name}: {cfg['model_bytes'] / 2**20:.0f} MiB, {cfg['nic_rate']} NICs "
                    f"(one transfer = {res['ideal_one_transfer_s']:.2f}s)")
    if name == "standalone":
        t.add_column("system")
        t.add_column(f"total GPU stall over {cfg['steps']} steps (s)", justify="right")
        t.add_column(f"trainer group ({cfg['trainer_gpus']} GPUs) (s)", justify="right")
        t.add_column(f"rollout pool ({cfg['rollouts']}) (s)", justify="right")
        t.add_column("mean rollout stall / step (s)", justify="right")
        for s, v in res["systems"].items():
            ro = [sum(x["rollout_stall_s"].values()) / len(x["rollout_stall_s"]) for x in v["steps"]]
            t.add_row(s, f"{v['total_stall_s']:.2f}", f"{cfg['trainer_gpus'] * v['trainer_rank0_stall_s']:.2f}",
                      f"{v['rollout_stall_s']:.2f}", f"{sum(ro) / len(ro):.2f}")
        key = "speedup_vs_gloo_broadcast"
    elif name == "elastic":
        t.add_column("system")
        t.add_column(f"{cfg['joiners']} joiners updated, {cfg['holders']} holders (s)", justify="right")
        for s, v in res["seconds_median"].items():
            t.add_row(s, f"{v:.2f}")
        key = "speedup_vs_p2p"
    else:
        t.add_column("system")
        t.add_column(f"total stall of {cfg['rollouts']} remote rollouts (s)", justify="right")
        t.add_column("wall (s)", justify="right")
        for s, v in res["total_stall_s_median"].items():
            t.add_row(s, f"{v:.2f}", f"{res['wall_s_median'][s]:.2f}")
        key = "speedup_vs_per_worker_pull"
    key = "speedup_delta_vs_full" if cfg.get("delta") else key
    c = Console(width=160)
    c.print(t)
    c.print(f"{key}: {res[key]}   exact bytes: {'yes' if res['exact'] else 'NO'}")
    if cfg.get("delta"):
        c.print({k: res[k] for k in ("delta_ratio_to_full", "crossing_bytes_per_delta", "crossing_data_bytes_per_delta",
                                     "speedup_delta_vs_per_worker_pull", "delta_modes", "gateway_modes",
                                     "crossing_bytes_per_delta_one_hub", "idle_crossing_bytes_per_s") if k in res})
    if name == "standalone":
        c.print(f"rollout_stall_speedup_vs_gloo_broadcast: {res['rollout_stall_speedup_vs_gloo_broadcast']}   "
                f"speedup_vs_gloo_broadcast_one_trainer_gpu: {res['speedup_vs_gloo_broadcast_one_trainer_gpu']}")


def plot(res: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    name = res["scenario"]
    if name == "standalone":
        vals = {s: v["total_stall_s"] for s, v in res["systems"].items()}
        ylabel, key = "total GPU stall (s, trainer group + pool, all steps)", "speedup_vs_gloo_broadcast"
    elif name == "elastic":
        vals, ylabel, key = res["seconds_median"], "seconds until every joiner is updated", "speedup_vs_p2p"
    else:
        vals = res["total_stall_s_median"]
        ylabel, key = "total stall of remote rollouts (s)", "speedup_vs_per_worker_pull"
    key = "speedup_delta_vs_full" if res["config"].get("delta") else key
    ax.bar(list(vals), list(vals.values()), color=["tab:red", "tab:blue", "tab:gray"][:len(vals)])
    ax.set_ylabel(ylabel)
    ax.set_title(f"{name}: {key} = {res[key]}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finish(res: dict, json_path: Path | None, t0: float) -> int:
    res["elapsed_s"] = round(time.monotonic() - t0, 1)
    print_summary(res)
    write_outputs(res, json_path, plot)
    return 0


def _parse(name: str, argv: list[str], model_mib: float, extra) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m rlsync.bench {name}", description=__doc__.split("\n")[0])
    add_common_args(p, model_mib)
    extra(p)
    return p.parse_args(argv)


def _delta_args(p: argparse.ArgumentParser, behind_help: str | None) -> None:
    p.add_argument("--delta", action="store_true", help="bf16 model, real-like updates; readers holding an older "
                   "version pull deltas (rlsync/bench/scenarios_delta.py), vs full fetches in the same run")
    p.add_argument("--update-frac", type=float, default=0.05,
                   help="share of bf16 elements one optimizer step changes (SmolLM2-135M, 4 steps: 0.035-0.08)")
    if behind_help:
        p.add_argument("--behind", type=int, default=2, help=behind_help)
    else:
        p.add_argument("--skip-p2p", action="store_true", help="leave out the per-worker pull baseline (slow)")


def _cannot(name: str) -> int | None:
    why = skip_reason()
    if why:
        print(f"{name}: cannot run: {why}")
        return 2
    return None


@register_scenario("standalone")
def standalone_main(argv: list[str]) -> int:
    def extra(p):
        p.add_argument("--rollouts", type=int, default=16, help="rollout workers in the fixed pool")
        p.add_argument("--steps", type=int, default=3)
        p.add_argument("--train-s", type=float, default=4.0, help="simulated trainer step (s)")
        p.add_argument("--gen-s", type=float, default=1.0, help="simulated generation per step (s)")
        p.add_argument("--trainer-gpus", type=int, default=TRAINER_GPUS,
                       help="ranks in the trainer group; each stalls as long as rank 0 (the publisher)")
    a = _parse("standalone", argv, 64.0, extra)
    if (rc := _cannot("standalone")) is not None:
        return rc
    t0 = time.monotonic()
    return _finish(run_standalone(config_from(a), a.rollouts, a.steps, a.train_s, a.gen_s, a.trainer_gpus),
                   a.json, t0)


@register_scenario("elastic")
def elastic_main(argv: list[str]) -> int:
    def extra(p):
        p.add_argument("--holders", type=int, default=2, help="workers already holding the version (m)")
        p.add_argument("--joiners", type=int, default=8, help="workers joining at once (k)")
        p.add_argument("--reps", type=int, default=1)
        _delta_args(p, "stale workers hold a version this many versions old and catch up (with --delta)")
    a = _parse("elastic", argv, 64.0, extra)
    if (rc := _cannot("elastic")) is not None:
        return rc
    t0 = time.monotonic()
    if a.delta:
        return _finish(run_elastic_delta(config_from(a), a.holders, a.joiners, a.reps, a.behind, a.update_frac),
                       a.json, t0)
    return _finish(run_elastic(config_from(a), a.holders, a.joiners, a.reps), a.json, t0)


@register_scenario("crossdc")
def crossdc_main(argv: list[str]) -> int:
    def extra(p):
        p.add_argument("--rollouts", type=int, default=40, help="rollout workers in the remote DC")
        p.add_argument("--dc-ratio", type=float, default=0.1, help="DC link rate / host NIC rate")
        p.add_argument("--reps", type=int, default=1)
        # Inside a DC the NICs are 1/dc-ratio times the DC link, so one relay can feed several
        # readers at the rate the version crosses: a shallower tree, less pipeline fill.
        p.set_defaults(fanout_cap=4)
        _delta_args(p, None)
        p.add_argument("--federated", action="store_true", help="with --delta: a hub per DC, the delta crossing via "
                       "dc1's gateway (rlsync/bench/scenarios_fed_delta.py), vs full versions and vs one hub")
    a = _parse("crossdc", argv, 8.0, extra)
    if (rc := _cannot("crossdc")) is not None:
        return rc
    t0 = time.monotonic()
    if a.delta and a.federated:
        return _finish(run_crossdc_delta_federated(config_from(a), a.rollouts, a.dc_ratio, a.reps, a.update_frac),
                       a.json, t0)
    if a.delta:
        return _finish(run_crossdc_delta(config_from(a), a.rollouts, a.dc_ratio, a.reps, a.update_frac,
                                         a.skip_p2p), a.json, t0)
    return _finish(run_crossdc(config_from(a), a.rollouts, a.dc_ratio, a.reps), a.json, t0)
