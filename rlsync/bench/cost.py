"""`python -m rlsync.bench cost`: tokens and final reward per dollar, a churning spot pool vs on-demand of equal cost.

    python -m rlsync.bench cost [--steps 100] [--seed 0] [--device-s 0.25] [--per-call 8] [--sim-steps 200] [--json F]

Two parts, one JSON (keys `tokens_per_dollar_ratio_spot_vs_on_demand`, `reward_per_dollar_ratio_spot_vs_on_demand`
are the emulated run's; `sim` holds the paper-scale ones):

- emulated run: `python -m rlsync.train +recipe=grpo_elastic steps=N` twice on this machine, one after the
  other: an on-demand pool of 1 rollout worker (fixed), and a spot pool of round(1 / spot_fraction) = 3 workers
  (the same cost per hour at the `PriceModel`'s 0.35) that churns: a seeded schedule preempts 2 (one with a 10 s
  notice, one killed) and adds 2 joiners. Cost = sum over steps of the step's wall time x (trainer at the
  on-demand price + the pool's live members at their price); start-up before step 1 is left out of both.
  Tokens = samples trained x 5 (the `reverse` task's answer, 4 symbols + eos). Final reward = mean
  `reward/mean` of the last 10 steps. Both runs share this machine's 2 cores, where a worker more brings no
  cores as a spot instance brings its accelerator. **Emulated accelerator** (`--device-s D`, the assumption
  docs/elastic.md states): each rollout worker is modelled as its own device, every rollout call (the same
  `--per-call` prompts x group_size samples in both runs: device time per call is device time per sample)
  taking D seconds on it after its real generation, a sleep
  (`inject.generate_delay_s`) that uses no shared core, so a worker's capacity does not shrink as workers are
  added. The trainer, the real generation, rewards, weight fetches and every churn event stay real and
  measured. `--device-s 0`: no device (workers share the cores: what the pool's size cannot buy here).
  The on-demand run's generate/train seconds per step (`on_demand_generate_over_train`) say how rollout-bound
  it is; the simulator's `sim_balance` gives the ratio that balance implies without churn.
- simulator (`rlsync.sim.cost.compare` at paper scale, and its sweep over preemption rate and notice).
The load average is written beside the figures.
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


def _train(run_dir: str, steps: int, seed: int, device: list[str], overrides: list[str]) -> tuple[list[dict], float]:
    cmd = [sys.executable, "-m", "rlsync.train", "+recipe=grpo_elastic", f"steps={steps}", f"seed={seed}",
           f"hydra.run.dir={run_dir}", "checkpoint.enabled=false", *device, *overrides]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f], time.monotonic() - t0


def price_run(rows: list[dict], pool: str, worker_price: float, trainer_price: float, samples_per_step: int) -> dict:
    """Cost, tokens and final reward of one run from its metrics.jsonl rows (prices per worker-second)."""
    cost, samples = 0.0, 0.0
    for prev, row in zip(rows, rows[1:]):
        dt = row["time"] - prev["time"]
        cost += dt * (trainer_price + row.get(f"pool/{pool}/members", 0.0) * worker_price)
        samples += samples_per_step - row.get("staleness/dropped", 0.0)
    reward = statistics.mean(r["reward/mean"] for r in rows[-10:])
    tokens = samples * TOKENS_PER_SAMPLE
    return {"wall_s": rows[-1]["time"] - rows[0]["time"], "cost": cost, "tokens": tokens, "final_reward": reward,
            "tokens_per_dollar": tokens / cost, "reward_per_dollar": reward / cost,
            "preemptions": sum(r.get("events/preemptions", 0.0) for r in rows),
            "joined": sum(r.get("events/joined", 0.0) for r in rows),
            "generate_over_train": sum(r.get("timing_s/generate", 0.0) for r in rows)
            / max(1e-9, sum(r.get("timing_s/train", 0.0) for r in rows))}


def run(steps: int, seed: int, sim_steps: int, device_s: float, per_call: int) -> dict:
    from rlsync.sim.cost import JobModel, PriceModel, balance_sweep, compare, sweep

    price = PriceModel()
    od, spot = price.on_demand_per_gpu_h / 3600.0, price.on_demand_per_gpu_h * price.spot_fraction / 3600.0
    n_spot = round(1 / price.spot_fraction)
    samples_per_step = 32 * 8  # grpo_elastic: prompts_per_step x group_size
    res: dict = {"load_before": os.getloadavg(), "spot_workers": n_spot, "spot_fraction": price.spot_fraction,
                 "emulated_device_s_per_call": device_s, "prompts_per_call": per_call}
    device = [f"inject.generate_delay_s={device_s}", f"rollout.prompts_per_request={per_call}"]
    with tempfile.TemporaryDirectory(prefix="rlsync-cost-") as tmp:
        rows, res["on_demand_run_s"] = _train(os.path.join(tmp, "od"), steps, seed, device,
                                              _pool(1, "fixed", seed, steps))
        res["on_demand"] = price_run(rows, "main", od, od, samples_per_step)
        rows, res["spot_run_s"] = _train(os.path.join(tmp, "spot"), steps, seed, device,
                                         _pool(n_spot, "spot", seed, steps))
        res["spot"] = price_run(rows, "spot", spot, od, samples_per_step)
    res["load_after"] = os.getloadavg()
    res["on_demand_generate_over_train"] = res["on_demand"]["generate_over_train"]
    res["tokens_per_dollar_ratio_spot_vs_on_demand"] = res["spot"]["tokens_per_dollar"] / res["on_demand"]["tokens_per_dollar"]
    res["reward_per_dollar_ratio_spot_vs_on_demand"] = res["spot"]["reward_per_dollar"] / res["on_demand"]["reward_per_dollar"]
    job = JobModel(steps=sim_steps)
    res["sim"] = compare(price, job)
    res["sim_sweep"], res["sim_balance"] = sweep(price, job), balance_sweep(price, job)
    return res


@register_scenario("cost")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench cost", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="steps of each emulated run (~1-3 min each on 2 cores)")
    p.add_argument("--seed", type=int, default=0, help="run seed and churn seed")
    p.add_argument("--per-call", type=int, default=8, help="prompts per rollout call, both runs (32 per step)")
    p.add_argument("--device-s", type=float, default=0.25,
                   help="emulated accelerator seconds per rollout call, each worker its own (0: none; docstring)")
    p.add_argument("--sim-steps", type=int, default=200, help="steps of the paper-scale simulated job")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    res = run(a.steps, a.seed, a.sim_steps, a.device_s, a.per_call)
    s = res["sim"]
    print("| | wall s | cost | tokens/$ | final reward | reward/$ |\n|---|---|---|---|---|---|")  # CLI output
    for k in ("on_demand", "spot"):
        r = res[k]
        print(f"| emulated {k} | {r['wall_s']:.1f} | {r['cost']:.4f} | {r['tokens_per_dollar']:.0f} | "
              f"{r['final_reward']:.3f} | {r['reward_per_dollar']:.2f} |")
    print(f"emulated: tokens/$ spot/on-demand {res['tokens_per_dollar_ratio_spot_vs_on_demand']:.3f}, reward/$ "
          f"{res['reward_per_dollar_ratio_spot_vs_on_demand']:.3f}; emulated device {a.device_s} s/call, "
          f"on-demand generate/train {res['on_demand_generate_over_train']:.2f} "
          f"(load {res['load_before'][0]:.1f} -> {res['load_after'][0]:.1f})")
    print(f"simulated (paper scale, {s['engines_on_demand']} on-demand vs {s['engines_spot']} spot engines): tokens/$ "
          f"cold joiners {s['tokens_per_dollar_ratio_spot_cold_vs_on_demand']:.3f}, warm {s['tokens_per_dollar_ratio_spot_warm_vs_on_demand']:.3f}")
    for row in res["sim_sweep"]:
        print(f"  preempt/h {row['preempt_per_h']}, notice {row['notice_fraction']}: cold {row['cold']}, warm {row['warm']}")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
