"""`python -m rlsync.bench chaos_vllm`: a real vLLM engine killed by SIGKILL inside fetch, apply or generate, restarted.

    python -m rlsync.bench chaos_vllm [--seeds 0 1 2] [--trials N] [--first-trial K] [--budget-s 600] [--step-s 10]
                                      [--kill engine|hub] [--no-spare] [--json F]

One embedded hub (worker timeout 3 s); in this process a trainer publishing SmolLM2-135M's fp32 tensors as a new
version every `--step-s` (release the last version, write, publish: the mutability contract) and another engine's
weight path (a hub reader taking every version; stands for the other engines, whose vLLM would break the one-engine-
per-engineer rule of this machine). The victim is a real vLLM engine in its own process
(rlsync/bench/_chaos_vllm_child.py: a warm joiner looping fetch -> apply -> generate), started and sampled once
before the trials. Each trial (rlsync/bench/_chaos_vllm_engine.py): seeded choice of a phase (fetch | apply |
generate) and a delay in [0, 0.3] s; when the live engine announces that phase of a version it has not sampled,
the bench waits the delay and kills it with SIGKILL; a new engine process (the spare kept imported and waiting;
`--no-spare`: a fresh interpreter) starts, and the trial ends at its first sample of a verified version (the
rejoin); it is the live engine of the next trial. `--kill hub`: the hub runs as its own `serve` process and each trial kills *it*
while the one engine process fetches or applies, then restarts it on the same address and journal
(rlsync/bench/_chaos_vllm_hub.py).

Chunks: trial i of seed s draws from its own generator (`trial_rng`), so `--seeds 0 --trials 25 --first-trial 25`
runs the same trials whichever run does them; `python -m rlsync.bench chaos_vllm_merge F...` sums chunks' JSON
files (rlsync/bench/chaos_vllm_merge.py). Without `--trials`, the seeds share `--budget-s` equally.

Figures (JSON keys): `trials`, `seeds`, `trainer_hangs` (a publish or release over 60 s), `failed_steps` (one that
raised), `other_engine_failures`, `unverified_samples_trained` (samples taken here from an engine process before
it announced the verified apply of their version: a sample is trained only after that, so always 0;
`unverified_samples_offered` counts what the rule dropped), `engine_hangs` (no sample / kill point within the
trial's limit), `rejoin_versions_behind_max` (the trainer's latest when the restarted engine's first sample
arrives, minus that sample's version: the rejoin is within one version when <= 1), `restart_s` (the killed process
reaped -> the new one started, p50), `trial_s` (wall per trial, mean), `split_s` (the median of each part of a trial),
`spare_wait_s` and the kill points actually hit (`killed_in`: where the process was when it died, read from its
last line). `--kill hub` adds `engine_deaths`, `hub_down_s` (kill -> listening again) and `kill_to_sample_s`
(kill -> the engine's first sample of the version it was fetching or applying, or a newer one). The load average
is beside, and per trial (`load_1m` in `trial_list`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import statistics
import threading
import time

from . import register_scenario

log = logging.getLogger(__name__)
HANG_S = 60.0


class _Trainer(threading.Thread):
    """Publishes a version every step_s; records each release/publish that raised or took over HANG_S."""

    def __init__(self, hub, model_dir: str, step_s: float):
        import torch
        import transformers

        from rlsync.hub import HubClient, Location

        super().__init__(daemon=True, name="chaos-trainer")
        m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.params = {n: p.data for n, p in m.named_parameters()}
        self.norm = self.params["model.norm.weight"].clone()
        self.client = HubClient(hub.address, token=hub.token)
        self.client.join(Location(host="trainer"), name="trainer")
        self.step_s, self.version, self.stop = step_s, 0, threading.Event()
        self.hangs, self.failed, self.steps = 0, 0, 0
        self.publish()

    def publish(self) -> None:
        t0 = time.monotonic()
        try:
            if self.version:
                self.client.release("policy", self.version)
            self.params["model.norm.weight"].copy_(self.norm * (0.7 + 0.05 * ((self.version + 1) % 8)))
            self.client.publish("policy", self.version + 1, self.params)
            self.version += 1
            self.steps += 1
        except Exception as e:  # noqa: BLE001 - counted: the figure is that this never happens
            self.failed += 1
            log.warning("trainer step %d failed: %s", self.version + 1, e)
        if time.monotonic() - t0 > HANG_S:
            self.hangs += 1

    def run(self) -> None:
        while not self.stop.wait(self.step_s):
            self.publish()


class _OtherEngine(threading.Thread):
    """Another engine's weight path: fetch every new version; counts failures."""

    def __init__(self, hub):
        from rlsync.hub import HubClient, Location

        super().__init__(daemon=True, name="chaos-other")
        self.client = HubClient(hub.address, token=hub.token)
        self.client.join(Location(host="other"), name="other-engine")
        self.stop, self.failures, self.fetched, self.held = threading.Event(), 0, 0, 0

    def run(self) -> None:
        into = None
        while not self.stop.is_set():
            latest = self.client.wait_latest("policy", self.held + 1, timeout_s=2.0)
            if latest is None or latest <= self.held:
                continue
            try:
                if self.held:
                    self.client.release("policy", self.held)
                res = self.client.fetch("policy", "latest", into=into)
                into, self.held = res.tensors, res.version
                self.fetched += 1
            except Exception as e:  # noqa: BLE001 - counted
                self.failures += 1
                log.warning("other engine: %s", e)


def trial_rng(seed: int, index: int) -> random.Random:
    """Trial `index` of `seed`'s own generator: the same trial whichever chunk runs it (`--first-trial`)."""
    return random.Random(f"chaos_vllm:{seed}:{index}")


def run(seeds: list[int], budget_s: float, step_s: float, kill: str = "engine", spare: bool = True,
        trials_per_seed: int = 0, first_trial: int = 0) -> dict:
    """`trials_per_seed` > 0: trials first_trial .. first_trial + n - 1 of each seed, stopping early (and saying
    so in `budget_hit`) once `budget_s` has passed; 0: the seeds share `budget_s` equally, as many as fit."""
    from rlsync.hub import HubConfig, start_embedded_hub
    from rlsync.rollout.vllm.model_dir import prepare_smollm2

    from ._chaos_vllm_engine import Live, Spares, engine_trial
    from ._chaos_vllm_hub import HubProcess, Victim, hub_trial

    t_start, load_before = time.monotonic(), os.getloadavg()
    model_dir = prepare_smollm2()
    # `--kill hub`: the hub is its own `serve` process, restarted on its address and journal after each kill
    hub = HubProcess(worker_timeout_s=3.0) if kill == "hub" else start_embedded_hub(config=HubConfig(worker_timeout_s=3.0))
    spares = Spares(hub.address, hub.token, model_dir, use=spare and kill == "engine")
    spares.refill()  # its imports overlap the trainer's model load below
    trainer, other = _Trainer(hub, model_dir, step_s), _OtherEngine(hub)
    trainer.start()
    other.start()
    trials: list[dict] = []
    victim = Victim(hub.address, hub.token, model_dir) if kill == "hub" else None
    if victim is not None and victim.wait(lambda e: "sample" in e, 0, 600.0) is None:  # started, fetched, generated
        raise RuntimeError("the engine process did not take a first version within 600 s")
    live = Live.start(spares, trainer) if victim is None else None  # the first engine: no trial, no restart
    log.info("engine processes' stderr: %s", spares.log_path)
    end, budget_hit = time.monotonic() + budget_s, False
    try:
        for k, seed in enumerate(seeds):
            seed_end = end if trials_per_seed else t_start + budget_s * (k + 1) / len(seeds)
            index = first_trial
            while time.monotonic() < seed_end and (not trials_per_seed or index < first_trial + trials_per_seed):
                rng = trial_rng(seed, index)
                if victim is None:
                    t, live = engine_trial(rng, spares, trainer, live)
                else:
                    t = hub_trial(rng, hub, victim, trainer)
                t.update(seed=seed, index=index)
                trials.append(t)
                if victim is None and len(trials) >= 3 and not any("restart_s" in x for x in trials[-3:]):
                    raise RuntimeError("3 engine processes in a row died before they started: the bench's set-up "
                                       "is broken (run the child by hand), not a chaos outcome")
                index += 1
                log.info("trial %d: %s", len(trials), t)
            budget_hit |= bool(trials_per_seed) and index < first_trial + trials_per_seed
    finally:
        trainer.stop.set()
        other.stop.set()
        trainer.join(timeout=HANG_S)
        other.join(timeout=HANG_S)
        spares.close()
        if live is not None:
            live.proc.kill()
            live.proc.wait()
        if victim is not None:
            victim.close()
    res = {"kill": kill, "trials": len(trials), "seeds": seeds, "first_trial": first_trial,
           "trials_per_seed": trials_per_seed, "budget_hit": budget_hit, "step_s": step_s,
           "trainer_hangs": trainer.hangs + int(trainer.is_alive()), "failed_steps": trainer.failed,
           "trainer_steps": trainer.steps, "other_engine_failures": other.failures + int(other.is_alive()),
           "other_engine_fetches": other.fetched, "unverified_samples_trained": 0,  # the trainer's rule drops them
           "engine_hangs": sum(t["hung"] for t in trials),
           "killed_in": {k: sum(t["killed_in"] == k for t in trials) for k in sorted({t["killed_in"] for t in trials})},
           "trial_s": statistics.mean(t["trial_s"] for t in trials) if trials else None,
           "rejoin_versions_behind_max": max((t.get("versions_behind", 99) for t in trials), default=None),
           "wall_s": round(time.monotonic() - t_start, 1), "load_before": load_before, "load_after": os.getloadavg()}
    res.update(_engine_figures(trials, spare) if victim is None else _hub_figures(trials, victim))
    res["trial_list"] = trials
    hub.stop()
    return res


def _median(trials: list[dict], key: str):
    vals = [t[key] for t in trials if key in t]
    return statistics.median(vals) if vals else None


def split_medians(trials: list[dict], key: str = "split") -> dict:
    """Median seconds of each part of an engine-kill trial (`split`, or `start_parts`: the engine start's own
    parts; rlsync/bench/_chaos_vllm_engine.py)."""
    parts = {p for t in trials for p in t.get(key, {})}
    return {p: statistics.median(t[key][p] for t in trials if p in t.get(key, {})) for p in sorted(parts)}


def _engine_figures(trials: list[dict], spare: bool) -> dict:
    """`unverified_samples_offered`: samples of versions not (yet) announced verified, which the rule dropped;
    `rejoin_versions_behind_max`: the trainer's latest minus the restarted engine's first sample's version."""
    return {"unverified_samples_offered": sum(t["unverified"] for t in trials),
            "samples_trained": sum(t["samples"] for t in trials), "spare": spare,
            "restart_s": _median(trials, "restart_s"), "spare_wait_s": _median(trials, "spare_wait_s"),
            "engine_died_unkilled": sum(t["exit"] != -signal.SIGKILL and not t["hung"] for t in trials),
            "split_s": split_medians(trials), "start_parts_s": split_medians(trials, "start_parts")}


def _hub_figures(trials: list[dict], victim) -> dict:
    down = [t["hub_down_s"] for t in trials if "hub_down_s" in t]
    back = [t["kill_to_sample_s"] for t in trials if "kill_to_sample_s" in t]
    return {"engine_deaths": victim.deaths, "unverified_samples_offered": victim.unverified,
            "samples_trained": victim.samples,
            "hub_down_s": statistics.median(down) if down else None, "hub_down_s_max": max(down, default=None),
            "kill_to_sample_s": statistics.median(back) if back else None,
            "kill_to_sample_s_max": max(back, default=None)}


@register_scenario("chaos_vllm")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench chaos_vllm", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--trials", type=int, default=0,
                   help="trials per seed in this run (a chunk; 0: as many as fit in --budget-s); "
                        "`python -m rlsync.bench chaos_vllm_merge` sums the chunks' JSON files")
    p.add_argument("--first-trial", type=int, default=0,
                   help="index of this chunk's first trial of each seed (trial i of a seed is the same in any chunk)")
    p.add_argument("--budget-s", type=float, default=600.0,
                   help="wall budget of the run (with --trials: a cap; the JSON says `budget_hit`)")
    p.add_argument("--step-s", type=float, default=10.0, help="seconds between the trainer's versions")
    p.add_argument("--kill", choices=("engine", "hub"), default="engine",
                   help="what the trials kill: the vLLM engine process, or the hub (its own process) mid-apply/fetch")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--no-spare", action="store_true",
                   help="start each engine process from scratch (no spare kept imported and waiting)")
    a = p.parse_args(argv)
    res = run(a.seeds, a.budget_s, a.step_s, a.kill, spare=not a.no_spare, trials_per_seed=a.trials,
              first_trial=a.first_trial)
    print(json.dumps({k: v for k, v in res.items() if k != "trial_list"}, indent=1))  # CLI output
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
