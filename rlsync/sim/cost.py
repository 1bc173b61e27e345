"""Throughput per dollar: a spot rollout pool that churns vs an on-demand pool of equal cost (issue 35 item 4).

    python -m rlsync.sim cost [--set NAME=VALUE ...] [--json F]

Pure arithmetic on a seeded timeline (no I/O): the same `PriceModel` drives the paper-scale estimate here
and prices the emulated run (`python -m rlsync.bench cost`). docs/elastic.md states and cites every number.

The job: `steps` GRPO steps, each training on `tokens_per_step` rollout tokens; the trainer (on-demand, never
preempted) takes `train_s` per step; rollouts run asynchronously with staleness 1 (batch s is generated while
step s-1 trains: generation of s starts once step s-2 is trained and batch s-1 is generated). Both pools cost
the same per hour: the spot pool has `1 / spot_fraction` times as many engines. A spot engine's life: up for an
exponential time (mean 1 / `preempt_per_h`), then preempted, with notice (`notice_fraction` of them: it finishes
the rollout call it is in if that fits in `notice_s`) or without (the call in flight is lost: uniform in
[0, `rollout_call_s`]); a replacement boots (`provision_s`) and starts its engine (`cold_start_s`, or
`warm_start_s` for a joiner that takes weights and compile cache from peers) plus the weights' fetch
(`weights_s`, from the simulator's paper-scale elastic join), all billed, no tokens. Same steps and staleness
bound on both sides is the "equal final reward" assumption, and `spot_steps_factor` (default 1.0) relaxes it:
the spot side trains that many times the on-demand side's steps to reach the same reward (the emulated run
measures the factor: its steps to a target reward, spot over on-demand).

Figures, spot vs on-demand, for a cold and a warm joiner: tokens (trained) per dollar, and reward per dollar at
equal final reward, i.e. the on-demand side's cost over the spot side's cost of reaching that reward (equal to
the tokens/$ ratio when the factor is 1.0).
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace


@dataclass(kw_only=True, slots=True)
class PriceModel:
    on_demand_per_gpu_h: float = 1.0
    """On-demand price of one GPU-hour; every figure is a ratio, so the unit cancels ($ per GPU-hour)."""
    spot_fraction: float = 0.35
    """Spot price / on-demand price: a 65% discount, inside AWS's "up to 90%" and GCP's "60-91%" (docs/elastic.md)."""
    preempt_per_h: float = 0.1
    """Preemptions per spot engine per hour (a 10 h mean life; AWS's advisor buckets are per month: ">20%" is
    the worst one, i.e. far fewer; this is a harsh GPU-capacity case)."""
    notice_fraction: float = 1.0
    """Share of preemptions with notice (AWS: a 2-minute interruption notice; GCP: 30 s)."""
    notice_s: float = 120.0
    """Notice a preempted engine gets (AWS 120 s; GCP 30 s)."""
    provision_s: float = 120.0
    """A replacement instance from request to a running OS (billed)."""
    cold_start_s: float = 480.0
    """Engine start of a joiner that reads the model from storage and compiles (ModelExpress: 8 min)."""
    warm_start_s: float = 104.0
    """Engine start with weights and kernel/compile artifacts from peers (ModelExpress: 1 min 44 s)."""
    weights_s: float = 3.0
    """A joiner's weight fetch from peers (the simulator's paper-scale elastic join: ~2.95 s)."""


@dataclass(kw_only=True, slots=True)
class JobModel:
    steps: int = 200
    tokens_per_step: float = 32e6
    """Rollout tokens trained per step."""
    train_s: float = 120.0
    """Trainer time per step (trainer GPUs busy; the trainer is on-demand)."""
    trainer_gpus: int = 2048
    engine_gpus: int = 32
    engines_on_demand: int = 256
    """The on-demand pool; the spot pool of equal cost has engines_on_demand / spot_fraction."""
    tokens_per_engine_s: float = 350.0
    """One engine's generation rate (tokens/s)."""
    rollout_call_s: float = 120.0
    """One rollout call (the work an engine loses to a preemption without notice: part of one call)."""
    spot_steps_factor: float = 1.0
    """Steps the spot side trains to reach the on-demand side's final reward, over `steps` (1.0: equal steps at
    equal staleness give equal reward, the assumption; `bench cost` measures it)."""
    seed: int = 0


def _down(rng: random.Random, p: PriceModel, horizon_s: float, start_s: float, call_s: float):
    """One spot engine slot's (start, end, lost_s) outages over [0, horizon): preempted, replaced, restarted."""
    out, t = [], 0.0
    while True:
        t += rng.expovariate(p.preempt_per_h / 3600.0) if p.preempt_per_h > 0 else horizon_s
        if t >= horizon_s:
            return out
        in_call = rng.uniform(0.0, call_s)
        notice = rng.random() < p.notice_fraction
        lost = 0.0 if notice and call_s - in_call <= p.notice_s else in_call
        end = t + p.provision_s + start_s + p.weights_s
        out.append((t, end, lost))
        t = end


def _capacity(job: JobModel, engines: int, outages: list[list[tuple]], horizon_s: float, dt: float) -> list[float]:
    """Tokens the pool generates in each dt slot (lost calls subtracted where they were lost)."""
    n = int(horizon_s / dt) + 1
    delta = [0.0] * (n + 1)  # engines down, as a difference array (outages are many, slots more)
    lost = [0.0] * n
    for slot in outages:
        for a, b, l in slot:
            i, j = int(a / dt), min(n, int(b / dt) + 1)
            if i < n:
                delta[i] += 1.0
                delta[j] -= 1.0
                lost[i] += l * job.tokens_per_engine_s
    out, down = [], 0.0
    for i in range(n):
        down += delta[i]
        out.append(max(0.0, (engines - down) * job.tokens_per_engine_s * dt - lost[i]))
    return out


def _run_job(job: JobModel, cap: list[float], dt: float) -> float:
    """Seconds to finish `steps` steps with async staleness 1, or inf if the horizon ran out."""
    i, acc = 0, 0.0
    gen_done, train_done = [0.0] * (job.steps + 1), [0.0] * (job.steps + 1)
    for s in range(1, job.steps + 1):
        start = max(gen_done[s - 1], train_done[s - 2] if s >= 2 else 0.0)
        i = max(i, int(start / dt))
        acc = 0.0
        while acc < job.tokens_per_step:
            if i >= len(cap):
                return float("inf")
            acc += cap[i]
            i += 1
        gen_done[s] = i * dt
        train_done[s] = max(gen_done[s], train_done[s - 1]) + job.train_s
    return train_done[job.steps]


def compare(price: PriceModel, job: JobModel, dt: float = 1.0) -> dict:
    """On-demand vs spot (cold and warm joiners) at equal pool cost per hour."""
    n_spot = int(round(job.engines_on_demand / price.spot_fraction))
    od_rate = price.on_demand_per_gpu_h / 3600.0
    trainer_rate = job.trainer_gpus * od_rate
    gen_od_s = job.tokens_per_step / (job.engines_on_demand * job.tokens_per_engine_s)
    spot_job = replace(job, steps=max(1, round(job.steps * job.spot_steps_factor)))
    horizon = max(job.steps, spot_job.steps) * (max(job.train_s, gen_od_s) + job.train_s) * 2
    res = {"price": asdict(price), "job": asdict(job), "engines_on_demand": job.engines_on_demand,
           "engines_spot": n_spot}
    od_wall = _run_job(job, [job.engines_on_demand * job.tokens_per_engine_s * dt] * int(horizon / dt), dt)
    od_cost = od_wall * (trainer_rate + job.engines_on_demand * job.engine_gpus * od_rate)
    res["on_demand"] = {"wall_s": od_wall, "cost": od_cost, "tokens_per_dollar": job.steps * job.tokens_per_step / od_cost}
    for kind, start in (("spot_cold", price.cold_start_s), ("spot_warm", price.warm_start_s)):
        rng = random.Random(job.seed)
        outages = [_down(rng, price, horizon, start, job.rollout_call_s) for _ in range(n_spot)]
        wall = _run_job(spot_job, _capacity(job, n_spot, outages, horizon, dt), dt)
        cost = wall * (trainer_rate + n_spot * job.engine_gpus * od_rate * price.spot_fraction)
        down_s = sum(b - a for o in outages for a, b, _ in o if a < wall)
        tpd = spot_job.steps * job.tokens_per_step / cost
        res[kind] = {"wall_s": wall, "cost": cost, "steps": spot_job.steps, "tokens_per_dollar": tpd,
                     "preemptions": sum(1 for o in outages for a, _, _ in o if a < wall),
                     "availability": 1 - down_s / (n_spot * wall)}
        res[f"tokens_per_dollar_ratio_{kind}_vs_on_demand"] = tpd / res["on_demand"]["tokens_per_dollar"]
        # both sides end at the same reward (spot after spot_job.steps): reward/$ is the cost ratio
        res[f"reward_per_dollar_ratio_{kind}_vs_on_demand"] = od_cost / cost
    res["tokens_per_dollar_ratio_spot_vs_on_demand"] = res["tokens_per_dollar_ratio_spot_warm_vs_on_demand"]
    res["reward_per_dollar_ratio_spot_vs_on_demand"] = res["reward_per_dollar_ratio_spot_warm_vs_on_demand"]
    return res


def sweep(price: PriceModel, job: JobModel) -> list[dict]:
    """The ratio over preemption rates and notice, the model's most uncertain inputs."""
    rows = []
    for rate in (0.01, 0.1, 0.5, 1.0):
        for notice in (1.0, 0.0):
            r = compare(replace(price, preempt_per_h=rate, notice_fraction=notice), job)
            rows.append({"preempt_per_h": rate, "notice_fraction": notice,
                         "cold": round(r["tokens_per_dollar_ratio_spot_cold_vs_on_demand"], 3),
                         "warm": round(r["tokens_per_dollar_ratio_spot_warm_vs_on_demand"], 3),
                         "availability_warm": round(r["spot_warm"]["availability"], 4)})
    return rows


def balance_sweep(price: PriceModel, job: JobModel) -> list[dict]:
    """The ratio over how rollout-bound the on-demand job is (its generation time per step / `train_s`): the
    spot pool's extra engines only help while generation, not the trainer, bounds the step."""
    rows = []
    for gen_over_train in (0.5, 1.0, 1.5, 2.0, 3.0):
        n = max(1, round(job.tokens_per_step / (gen_over_train * job.train_s * job.tokens_per_engine_s)))
        r = compare(price, replace(job, engines_on_demand=n))
        rows.append({"gen_over_train_on_demand": gen_over_train, "engines_on_demand": n,
                     "cold": round(r["tokens_per_dollar_ratio_spot_cold_vs_on_demand"], 3),
                     "warm": round(r["tokens_per_dollar_ratio_spot_warm_vs_on_demand"], 3)})
    return rows
