"""`python -m rlsync.bench chaos_vllm`: a real vLLM engine killed by SIGKILL inside fetch, apply or generate, restarted.

    python -m rlsync.bench chaos_vllm [--seeds 0 1 2] [--budget-s 600] [--step-s 10] [--kill engine|hub]
                                      [--no-spare] [--json F]

One embedded hub (worker timeout 3 s); in this process a trainer publishing SmolLM2-135M's fp32 tensors as a new
version every `--step-s` (release the last version, write, publish: the mutability contract) and another engine's
weight path (a hub reader taking every version; stands for the other engines, whose vLLM would break the one-engine-
per-engineer rule of this machine). The victim is a real vLLM engine in its own process
(rlsync/bench/_chaos_vllm_child.py: a warm joiner looping fetch -> apply -> generate). Each trial: seeded choice of a
phase (fetch | apply | generate) and a delay in [0, 0.3] s; when the engine announces that phase, the bench waits
the delay and kills it with SIGKILL, then starts a new engine process: the spare one kept imported and waiting
(`_Spares`; `--no-spare`: a fresh interpreter). Seeds share `--budget-s` equally.
`--kill hub`: the hub runs as its own `serve` process and each trial kills *it* while the one engine process
fetches or applies, then restarts it on the same address and journal (rlsync/bench/_chaos_vllm_hub.py).

Figures (JSON keys): `trials`, `seeds`, `trainer_hangs` (a publish or release over 60 s), `failed_steps` (one that
raised), `other_engine_failures`, `unverified_samples_trained` (samples taken here from an engine process before
it announced the verified apply of their version: a sample is trained only after that), `rejoin_versions_behind_max`
(the trainer's latest minus the restarted engine's first sample's version), `restart_s` (taken, spare or spawned,
to started, p50), `trial_s` (wall per trial, mean), `spare_wait_s` (waiting for the spare's imports, p50) and the
kill points actually hit (`killed_in`: where the process was when it died, read from its last line). `--kill hub`
adds `engine_hangs`, `engine_deaths`, `hub_down_s` (kill -> listening again) and `kill_to_sample_s` (kill -> the
engine's first sample of the version it was fetching or applying, or a newer one). The load average is beside.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

from . import register_scenario
from ._chaos_vllm_child import parse as _parse

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


class _Spares:
    """One engine process kept imported and waiting (`--spare`): a restart does not pay `import vllm` (12-25 s
    here, docs/elastic.md). The next spare is spawned once the engine it replaces has started, so its imports
    overlap the trial rather than the start-up."""

    def __init__(self, address: str, token: str, model_dir: str, use: bool = True):
        self.cmd = [sys.executable, "-m", "rlsync.bench._chaos_vllm_child", address, model_dir, "victim"]
        self.env, self.use = dict(os.environ, RLSYNC_HUB_TOKEN=token), use
        self.spare: subprocess.Popen | None = None

    def take(self) -> tuple[subprocess.Popen, float]:
        """A started engine process: the spare (waiting for its imports if they are not done) or a fresh one;
        the seconds waited for the spare."""
        if not self.use:
            return subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                    env=self.env), 0.0
        proc, self.spare = self.spare or self._spawn(), None
        t0 = time.monotonic()
        for line in proc.stdout:
            if _parse(line).get("ready"):
                break
        proc.stdin.write("go\n")
        proc.stdin.flush()
        return proc, time.monotonic() - t0

    def _spawn(self) -> subprocess.Popen:
        return subprocess.Popen([*self.cmd, "--spare"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=self.env)

    def refill(self) -> None:
        if self.use and self.spare is None:
            self.spare = self._spawn()

    def close(self) -> None:
        if self.spare is not None:
            self.spare.kill()
            self.spare.wait()


def _trial(rng: random.Random, spares: _Spares, trainer: _Trainer) -> dict:
    phase, delay = rng.choice(["fetch", "apply", "generate"]), rng.uniform(0.0, 0.3)
    t0 = time.monotonic()
    proc, spare_wait = spares.take()
    out = {"phase": phase, "delay_s": round(delay, 3), "unverified": 0, "samples": 0,
           "spare_wait_s": round(spare_wait, 2)}
    applied, last, first_sample = set(), {}, None
    watchdog = threading.Timer(600.0, proc.kill)  # a silent child must not stall the bench
    watchdog.start()
    try:
        for line in proc.stdout:
            ev = _parse(line)
            last = ev or last
            if ev.get("started"):
                out["restart_s"] = round(time.monotonic() - t0, 2)
                spares.refill()
            if "applied" in ev:
                applied.add(ev["applied"])
            if "sample" in ev:  # the trainer's side of the rule: train only samples of a verified apply
                if ev["sample"] in applied:
                    out["samples"] += ev["n"]
                    if first_sample is None:
                        first_sample = ev["sample"]
                        out["versions_behind"] = trainer.version - ev["sample"]
                else:
                    out["unverified"] += ev["n"]
            if ev.get("phase") == phase and first_sample is not None:
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        proc.wait(timeout=60)
        rest = [e for e in map(_parse, proc.stdout.read().splitlines()) if e]  # lines written before it died
    last = rest[-1] if rest else last
    out["exit"] = proc.returncode  # -9: our SIGKILL; anything else: the engine died on its own
    out["killed_in"] = last.get("phase") or ("after_apply" if "applied" in last else "after_generate")
    out["trial_s"] = round(time.monotonic() - t0, 2)
    return out


def run(seeds: list[int], budget_s: float, step_s: float, kill: str = "engine", spare: bool = True) -> dict:
    from rlsync.hub import HubConfig, start_embedded_hub
    from rlsync.rollout.vllm.model_dir import prepare_smollm2

    from ._chaos_vllm_hub import HubProcess, Victim, hub_trial

    model_dir = prepare_smollm2()
    load_before = os.getloadavg()
    # `--kill hub`: the hub is its own `serve` process, restarted on its address and journal after each kill
    hub = HubProcess(worker_timeout_s=3.0) if kill == "hub" else start_embedded_hub(config=HubConfig(worker_timeout_s=3.0))
    trainer, other = _Trainer(hub, model_dir, step_s), _OtherEngine(hub)
    trainer.start()
    other.start()
    trials: list[dict] = []
    victim = Victim(hub.address, hub.token, model_dir) if kill == "hub" else None
    if victim is not None and victim.wait(lambda e: "sample" in e, 0, 600.0) is None:  # started, fetched, generated
        raise RuntimeError("the engine process did not take a first version within 600 s")
    spares = _Spares(hub.address, hub.token, model_dir, use=spare)
    try:
        for seed in seeds:
            rng, end = random.Random(seed), time.monotonic() + budget_s / len(seeds)
            while time.monotonic() < end:
                if victim is None:
                    t = _trial(rng, spares, trainer)
                else:
                    t = hub_trial(rng, hub, victim, trainer)
                t["seed"] = seed
                trials.append(t)
                log.info("trial %d: %s", len(trials), t)
    finally:
        trainer.stop.set()
        other.stop.set()
        trainer.join(timeout=HANG_S)
        other.join(timeout=HANG_S)
        spares.close()
        if victim is not None:
            victim.close()
    if victim is not None:
        return _hub_figures(trials, seeds, trainer, other, victim, hub, load_before)
    res = {"trials": len(trials), "seeds": seeds, "trainer_hangs": trainer.hangs + int(trainer.is_alive()),
           "failed_steps": trainer.failed, "trainer_steps": trainer.steps,
           "other_engine_failures": other.failures + int(other.is_alive()), "other_engine_fetches": other.fetched,
           "unverified_samples_trained": 0,  # the rule above drops them; `unverified_samples_offered` counts them
           "unverified_samples_offered": sum(t["unverified"] for t in trials),
           "samples_trained": sum(t["samples"] for t in trials),
           "rejoin_versions_behind_max": max((t.get("versions_behind", 99) for t in trials), default=None),
           "restart_s": statistics.median(t.get("restart_s", float("nan")) for t in trials) if trials else None,
           "trial_s": statistics.mean(t["trial_s"] for t in trials) if trials else None, "spare": spare,
           "spare_wait_s": statistics.median(t["spare_wait_s"] for t in trials) if trials else None,
           "engine_died_unkilled": sum(t["exit"] != -signal.SIGKILL for t in trials),
           "killed_in": {k: sum(t["killed_in"] == k for t in trials) for k in {t["killed_in"] for t in trials}},
           "load_before": load_before, "load_after": os.getloadavg(), "trial_list": trials}
    hub.stop()
    return res


def _hub_figures(trials, seeds, trainer, other, victim, hub, load_before) -> dict:
    down = [t["hub_down_s"] for t in trials if "hub_down_s" in t]
    back = [t["kill_to_sample_s"] for t in trials if "kill_to_sample_s" in t]
    res = {"kill": "hub", "trials": len(trials), "seeds": seeds,
           "trainer_hangs": trainer.hangs + int(trainer.is_alive()), "failed_steps": trainer.failed,
           "trainer_steps": trainer.steps, "other_engine_failures": other.failures + int(other.is_alive()),
           "other_engine_fetches": other.fetched, "engine_hangs": sum(t["hung"] for t in trials),
           "engine_deaths": victim.deaths, "unverified_samples_trained": 0,
           "unverified_samples_offered": victim.unverified, "samples_trained": victim.samples,
           "killed_in": {k: sum(t["killed_in"] == k for t in trials) for k in {t["killed_in"] for t in trials}},
           "hub_down_s": statistics.median(down) if down else None, "hub_down_s_max": max(down, default=None),
           "kill_to_sample_s": statistics.median(back) if back else None,
           "kill_to_sample_s_max": max(back, default=None),
           "trial_s": statistics.mean(t["trial_s"] for t in trials) if trials else None,
           "load_before": load_before, "load_after": os.getloadavg(), "trial_list": trials}
    hub.stop()
    return res


@register_scenario("chaos_vllm")
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.bench chaos_vllm", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget-s", type=float, default=600.0, help="wall budget shared by the seeds")
    p.add_argument("--step-s", type=float, default=10.0, help="seconds between the trainer's versions")
    p.add_argument("--kill", choices=("engine", "hub"), default="engine",
                   help="what the trials kill: the vLLM engine process, or the hub (its own process) mid-apply/fetch")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--no-spare", action="store_true",
                   help="start each engine process from scratch (no spare kept imported and waiting)")
    a = p.parse_args(argv)
    res = run(a.seeds, a.budget_s, a.step_s, a.kill, spare=not a.no_spare)
    print(json.dumps({k: v for k, v in res.items() if k != "trial_list"}, indent=1))  # CLI output
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0
