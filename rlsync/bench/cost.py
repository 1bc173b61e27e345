"""`python -m rlsync.bench cost`: tokens and final reward per dollar, a churning spot pool vs on-demand of equal cost.

    python -m rlsync.bench cost [--steps 250] [--seeds 0 1] [--target 0.9] [--device-s 0.25] [--per-call 8]
                                [--sim-steps 200] [--out DIR] [--json F]
    python -m rlsync.bench cost --merge F1 F2 [--json F]     # seeds run in separate invocations, as one result
    python -m rlsync.bench cost --out DIR --reuse [...]     # price the runs kept in DIR again, run the missing

Two parts, one JSON (keys `tokens_per_dollar_ratio_spot_vs_on_demand`, `reward_per_dollar_ratio_spot_vs_on_demand`
are the emulated run's medians over seeds at equal reward; `sim*` hold the paper-scale ones):

- emulated run, per seed: `python -m rlsync.train +recipe=grpo_elastic steps=N` twice on this machine, one after
  the other: an on-demand pool of 1 rollout worker (fixed), and a spot pool of round(1 / spot_fraction) = 3
  workers (the same cost per hour at the `PriceModel`'s 0.35) that churns: a seeded schedule preempts 2 (one with
  a 10 s notice, one killed) and adds 2 joiners. Cost = sum over steps of the step's wall time x (trainer at the
  on-demand price + the pool's live members at their price); start-up before step 1 is left out of both.
  Tokens = samples trained x 5 (the `reverse` task's answer, 4 symbols + eos).
  **Equal final reward**, measured: each run is priced up to the first step whose trailing 10-step mean reward
  reaches `--target` (the same reward on both sides): tokens/$ up to it, and reward/$ at it, i.e. the dollars
  the on-demand run spent to reach it over the spot run's. The whole run is priced too, with its final reward
  (last-10 mean) side by side. Each figure per seed, then median, min, max.
  Both runs share this machine's 2 cores, where a worker more brings no cores as a spot instance brings its
  accelerator. **Emulated accelerator** (`--device-s D`, the assumption docs/elastic.md states): each rollout
  worker is modelled as its own device, every rollout call (the same `--per-call` prompts x group_size samples in
  both runs: device time per call is device time per sample) taking D seconds on it after its real generation, a
  sleep (`inject.generate_delay_s`) that uses no shared core, so a worker's capacity does not shrink as workers
  are added. The trainer, the real generation, rewards, weight fetches and every churn event stay real and
  measured. `--device-s 0`: no device (workers share the cores: what the pool's size cannot buy here).
  The on-demand run's generate/train seconds per step (`on_demand_generate_over_train`) say how rollout-bound
  it is; the simulator's `sim_balance` gives the ratio that balance implies without churn.
- simulator (`rlsync.sim.cost.compare` at paper scale, its sweep over preemption rate and notice, and
  `sim_at_measured_steps`: the same at the emulated run's measured steps-to-target ratio, spot over on-demand,
  in place of the simulator's equal-steps assumption).
The load average is written beside the figures, per seed and overall.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from . import register_scenario

TOKENS_PER_SAMPLE = 5


def _pool(size: int, policy: str, seed: int, steps: int) -> list[str]:
    if policy == "fixed":  # the recipe's pool carries a churn schedule: an on-demand pool is `main`
        return ["~pools.spot", f"pools.main.size={size}"]
    return [f"pools.spot.size={size}", f"pools.spot.max_size={size}", "pools.spot.min_size=1",
            f"pools.spot.churn.seed={seed}", "pools.spot.churn.preemptions=2", "pools.spot.churn.joins=2",
            "pools.spot.churn.notice_fraction=0.5", f"pools.spot.churn.first_step={steps // 10}",
            f"pools.spot.churn.last_step={steps * 3 // 4}"]


def _kept(run_dir: str, steps: int, seed: int, device_s: float, per_call: int) -> list[dict] | None:
    """A kept run's rows (`--reuse`) if its config is this one's, else None (it is run)."""
    try:
        with open(os.path.join(run_dir, "config.json")) as f:
            c = json.load(f)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    except FileNotFoundError:
        return None
    same = (c["steps"], c["seed"], c["inject"]["generate_delay_s"], c["rollout"]["prompts_per_request"]) == \
        (steps, seed, device_s, per_call)
    return rows if same and len(rows) == steps else None


def _train(run_dir: str, steps: int, seed: int, device: list[str], overrides: list[str]) -> tuple[list[dict], float]:
    cmd = [sys.executable, "-m", "rlsync.train", "+recipe=grpo_elastic", f"steps={steps}", f"seed={seed}",
           f"hydra.run.dir={run_dir}", "checkpoint.enabled=false", *device, *overrides]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], time.monotonic() - t0


def _at(rows: list[dict], i: int, pool: str, worker_price: float, trainer_price: float,
        samples_per_step: int) -> tuple[float, float]:
    """(cost, samples trained) from step 1's row up to row i (the start-up before step 1 is left out)."""
    cost, samples = 0.0, 0.0
    for prev, row in zip(rows[:i], rows[1:i + 1]):
        cost += (row["time"] - prev["time"]) * (trainer_price + row.get(f"pool/{pool}/members", 0.0) * worker_price)
        samples += samples_per_step - row.get("staleness/dropped", 0.0)
    return cost, samples


def price_run(rows: list[dict], pool: str, worker_price: float, trainer_price: float, samples_per_step: int,
              target: float | None = None) -> dict:
    """Cost, tokens and final reward of one run from its metrics.jsonl rows (prices per worker-second); with
    `target`, `at_target` prices the run up to the first step whose trailing 10-step mean reward >= target."""
    cost, samples = _at(rows, len(rows) - 1, pool, worker_price, trainer_price, samples_per_step)
    reward = statistics.mean(r["reward/mean"] for r in rows[-10:])
    tokens = samples * TOKENS_PER_SAMPLE
    out = {"wall_s": rows[-1]["time"] - rows[0]["time"], "cost": cost, "tokens": tokens, "final_reward": reward,
           "tokens_per_dollar": tokens / cost, "reward_per_dollar": reward / cost,
           "preemptions": sum(r.get("events/preemptions", 0.0) for r in rows),
           "joined": sum(r.get("events/joined", 0.0) for r in rows),
           "generate_over_train": sum(r.get("timing_s/generate", 0.0) for r in rows)
           / max(1e-9, sum(r.get("timing_s/train", 0.0) for r in rows))}
    if target is not None:
        r = [row["reward/mean"] for row in rows]
        i = next((i for i in range(9, len(r)) if sum(r[i - 9:i + 1]) / 10 >= target), None)
        out["at_target"] = None
        if i is not None:
            c, n = _at(rows, i, pool, worker_price, trainer_price, samples_per_step)
            out["at_target"] = {"step": rows[i]["step"], "wall_s": rows[i]["time"] - rows[0]["time"], "cost": c,
                                "tokens": n * TOKENS_PER_SAMPLE, "tokens_per_dollar": n * TOKENS_PER_SAMPLE / c}
    return out


def seed_ratios(od: dict, spot: dict) -> dict:
    """Spot / on-demand for one seed: at the target reward (None if either run missed it) and over the whole run."""
    out = {"tokens_per_dollar_full_run": spot["tokens_per_dollar"] / od["tokens_per_dollar"],
           "reward_per_dollar_full_run": spot["reward_per_dollar"] / od["reward_per_dollar"],
           "final_reward_difference": spot["final_reward"] - od["final_reward"],
           "tokens_per_dollar_at_target": None, "dollars_to_target_on_demand_over_spot": None,
           "steps_to_target_spot_over_on_demand": None}
    a, b = od.get("at_target"), spot.get("at_target")
    if a and b:
        out["tokens_per_dollar_at_target"] = b["tokens_per_dollar"] / a["tokens_per_dollar"]
        out["dollars_to_target_on_demand_over_spot"] = a["cost"] / b["cost"]  # = reward/$ at the equal reward
        out["steps_to_target_spot_over_on_demand"] = b["step"] / a["step"]
    return out


def summarize(seeds: list[dict]) -> dict:
    """Median, min, max over seeds of every per-seed ratio; the issue's two keys are the at-target medians."""
    res: dict = {"seeds": [s["seed"] for s in seeds],
                 "seeds_reached_target": sum(s["ratios"]["tokens_per_dollar_at_target"] is not None for s in seeds)}
    for k in seeds[0]["ratios"]:
        v = [s["ratios"][k] for s in seeds if s["ratios"][k] is not None]
        res[k] = {"median": statistics.median(v), "min": min(v), "max": max(v), "values": v} if v else None
    med = lambda k: res[k]["median"] if res[k] else None  # noqa: E731
    res["tokens_per_dollar_ratio_spot_vs_on_demand"] = med("tokens_per_dollar_at_target")
    res["reward_per_dollar_ratio_spot_vs_on_demand"] = med("dollars_to_target_on_demand_over_spot")
    return res


def simulate(res: dict, sim_steps: int) -> None:
    """The paper-scale figures, at equal steps (the simulator's assumption) and at the measured steps ratio."""
    from dataclasses import replace

    from rlsync.sim.cost import JobModel, PriceModel, balance_sweep, compare, sweep
    price, job = PriceModel(), JobModel(steps=sim_steps)
    res["sim"] = compare(price, job)
    res["sim_sweep"], res["sim_balance"] = sweep(price, job), balance_sweep(price, job)
    factor = res["steps_to_target_spot_over_on_demand"]
    res["sim_at_measured_steps"] = compare(price, replace(job, spot_steps_factor=factor["median"])) if factor else None


def run(steps: int, seeds: list[int], sim_steps: int, device_s: float, per_call: int, target: float,
        out: str | None, reuse: bool = False) -> dict:
    from rlsync.sim.cost import PriceModel

    price = PriceModel()
    od, spot = price.on_demand_per_gpu_h / 3600.0, price.on_demand_per_gpu_h * price.spot_fraction / 3600.0
    n_spot = round(1 / price.spot_fraction)
    samples_per_step = 32 * 8  # grpo_elastic: prompts_per_step x group_size
    res: dict = {"load_before": os.getloadavg(), "spot_workers": n_spot, "spot_fraction": price.spot_fraction,
                 "emulated_device_s_per_call": device_s, "prompts_per_call": per_call, "steps": steps,
                 "target_reward": target, "per_seed": []}
    device = [f"inject.generate_delay_s={device_s}", f"rollout.prompts_per_request={per_call}"]
    with tempfile.TemporaryDirectory(prefix="rlsync-cost-") as tmp:
        for seed in seeds:
            base, r = os.path.join(out or tmp, f"seed_{seed}"), {"seed": seed, "load_before": os.getloadavg()}
            for name, pool, size, policy, price_w in (("on_demand", "main", 1, "fixed", od),
                                                      ("spot", "spot", n_spot, "spot", spot)):
                d = os.path.join(base, "od" if pool == "main" else "spot")
                rows, r[f"{name}_run_s"] = (_kept(d, steps, seed, device_s, per_call) if reuse else None), None
                if rows is None:
                    rows, r[f"{name}_run_s"] = _train(d, steps, seed, device, _pool(size, policy, seed, steps))
                r[name] = price_run(rows, pool, price_w, od, samples_per_step, target)
            r["load_after"], r["ratios"] = os.getloadavg(), seed_ratios(r["on_demand"], r["spot"])
            res["per_seed"].append(r)
    res["load_after"] = os.getloadavg()
    res["on_demand_generate_over_train"] = statistics.median(r["on_demand"]["generate_over_train"] for r in res["per_seed"])
    res.update(summarize(res["per_seed"]))
    simulate(res, sim_steps)
    return res


def merge(paths: list[str], sim_steps: int) -> dict:
    """Several runs' seeds as one result (each run under the machine lock's time limit); settings must agree."""
    parts = [json.load(open(p)) for p in paths]
    keys = ("emulated_device_s_per_call", "prompts_per_call", "steps", "target_reward")
    for p, part in zip(paths[1:], parts[1:]):
        if any(part[k] != parts[0][k] for k in keys):
            raise SystemExit(f"--merge: {p} was run with other settings ({', '.join(keys)} must be equal)")
    seeds = [s["seed"] for part in parts for s in part["per_seed"]]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--merge: seeds {seeds} repeat; merge runs of different seeds")
    res = {k: v for k, v in parts[0].items() if not k.startswith("sim")}
    res["per_seed"] = [s for part in parts for s in part["per_seed"]]
    res["load_before"], res["load_after"] = parts[0]["load_before"], parts[-1]["load_after"]
    res["on_demand_generate_over_train"] = statistics.median(r["on_demand"]["generate_over_train"] for r in res["per_seed"])
    res.update(summarize(res["per_seed"]))
    simulate(res, sim_steps)
    return res


def _spread(x: dict | None, f: str = "{:.2f}") -> str:
    return "n/a" if not x else f"{f.format(x['median'])} ({f.format(x['min'])}-{f.format(x['max'])})"


@register_scenario("cost")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench cost", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=250, help="steps of each emulated run (see --target)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="run seeds and churn seeds")
    p.add_argument("--target", type=float, default=0.9, help="the equal reward: a trailing 10-step mean")
    p.add_argument("--per-call", type=int, default=8, help="prompts per rollout call, both runs (32 per step)")
    p.add_argument("--device-s", type=float, default=0.25,
                   help="emulated accelerator seconds per rollout call, each worker its own (0: none; docstring)")
    p.add_argument("--sim-steps", type=int, default=200, help="steps of the paper-scale simulated job")
    p.add_argument("--out", help="keep the run dirs here (OUT/seed_S/od, OUT/seed_S/spot); default: removed")
    p.add_argument("--reuse", action="store_true",
                   help="price runs kept in --out with the same settings again (another --target) instead of running")
    p.add_argument("--merge", nargs="+", metavar="F", help="combine earlier --json files' seeds; runs nothing")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    res = merge(a.merge, a.sim_steps) if a.merge else run(a.steps, a.seeds, a.sim_steps, a.device_s, a.per_call,
                                                          a.target, a.out, a.reuse)
    print("| seed | pool | wall s | cost | tokens/$ | final reward | step at target | $ to target |\n"  # CLI output
          "|---|---|---|---|---|---|---|---|")
    for r in res["per_seed"]:
        for k in ("on_demand", "spot"):
            x, t = r[k], r[k]["at_target"]
            at = f"{t['step']} | {t['cost']:.4f}" if t else "- | -"
            print(f"| {r['seed']} | {k} | {x['wall_s']:.1f} | {x['cost']:.4f} | {x['tokens_per_dollar']:.0f} | "
                  f"{x['final_reward']:.3f} | {at} |")
    print(f"emulated, {len(res['per_seed'])} seeds, median (min-max), spot / on-demand: at reward "
          f"{res['target_reward']} ({res['seeds_reached_target']} seeds reached it in both): tokens/$ "
          f"{_spread(res['tokens_per_dollar_at_target'])}, reward/$ = $ to it {_spread(res['dollars_to_target_on_demand_over_spot'])}, "
          f"steps to it {_spread(res['steps_to_target_spot_over_on_demand'])}; whole run tokens/$ "
          f"{_spread(res['tokens_per_dollar_full_run'])}, final reward spot - on-demand "
          f"{_spread(res['final_reward_difference'], '{:+.3f}')}; device {res['emulated_device_s_per_call']} s/call, "
          f"on-demand generate/train {res['on_demand_generate_over_train']:.1f} "
          f"(load {res['load_before'][0]:.1f} -> {res['load_after'][0]:.1f})")
    s = res["sim"]
    print(f"simulated (paper scale, {s['engines_on_demand']} on-demand vs {s['engines_spot']} spot engines): tokens/$ "
          f"cold joiners {s['tokens_per_dollar_ratio_spot_cold_vs_on_demand']:.3f}, warm {s['tokens_per_dollar_ratio_spot_warm_vs_on_demand']:.3f}")
    m = res["sim_at_measured_steps"]
    if m:
        print(f"  at the measured steps ratio {m['job']['spot_steps_factor']:.3f}: reward/$ at equal reward cold "
              f"{m['reward_per_dollar_ratio_spot_cold_vs_on_demand']:.3f}, warm {m['reward_per_dollar_ratio_spot_warm_vs_on_demand']:.3f}")
    for row in res["sim_sweep"]:
        print(f"  preempt/h {row['preempt_per_h']}, notice {row['notice_fraction']}: cold {row['cold']}, warm {row['warm']}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
