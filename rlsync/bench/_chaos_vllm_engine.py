"""`bench chaos_vllm --kill engine`: one trial = a real vLLM engine process started, its first sample, then SIGKILL.

A trial takes an engine process (the spare kept imported and waiting, or a fresh one), waits for its first sample
of a verified version (the rejoin), then for the seeded phase (fetch | apply | generate) of its next version, waits
the seeded delay and kills it. Every child line's arrival time is kept, so a trial's wall splits into its parts
(`split`): `spare_wait` (the spare's imports not done yet), `engine_start` ("go" -> started: join, the start-up
cache, vLLM's engine set-up with dummy weights), `first_fetch`, `first_apply_check` (apply + the receiver's
checks), `first_generate`, `to_kill_phase` (waiting for the trainer's next version, then to the phase), `delay`
and `reap` (SIGKILL -> the process gone); `start_parts` splits `engine_start` by the child's own clock.

Rejoin within one version: `versions_behind` = the trainer's latest version when the restarted engine's first
sample (of a verified apply) arrives, minus that sample's version; the rejoin holds when it is <= 1.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from ._chaos_vllm_child import parse

TRIAL_HANG_S = 180.0  # no kill point reached by then: the restarted engine hung (counted, then killed)


class Spares:
    """One engine process kept imported and waiting: a restart does not pay `import vllm` (12-25 s at load 20,
    docs/elastic.md). The first is spawned when the bench starts (its imports overlap the trainer's model load);
    each next one once the engine it will replace has started, so its imports overlap the trial."""

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
            if parse(line).get("ready"):
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


def _split(marks: dict[str, float]) -> dict[str, float]:
    """Consecutive differences of the trial's marks, in order; a part whose end never came is left out."""
    order = ["t0", "taken", "started", "fetch", "apply", "applied", "generate", "sample", "phase", "kill", "reaped"]
    names = ["spare_wait", "engine_start", "join_to_fetch", "first_fetch", "first_apply_check", "to_generate",
             "first_generate", "to_kill_phase", "delay", "reap"]
    out = {}
    for name, a, b in zip(names, order, order[1:]):
        if a in marks and b in marks:
            out[name] = round(marks[b] - marks[a], 2)
    return out


def engine_trial(rng, spares: Spares, trainer) -> dict:
    """One trial; its record (phase, delay, samples, versions_behind, split, trial_s, load_1m, ...)."""
    phase, delay = rng.choice(["fetch", "apply", "generate"]), rng.uniform(0.0, 0.3)
    marks = {"t0": time.monotonic()}
    proc, spare_wait = spares.take()
    marks["taken"] = time.monotonic()
    out = {"phase": phase, "delay_s": round(delay, 3), "unverified": 0, "samples": 0, "hung": 0,
           "spare_wait_s": round(spare_wait, 2)}
    applied, last, first_sample = set(), {}, None
    hung = threading.Event()

    def on_hang():
        hung.set()
        proc.kill()

    watchdog = threading.Timer(TRIAL_HANG_S, on_hang)  # a silent child must not stall the bench
    watchdog.start()
    try:
        for line in proc.stdout:
            ev, now = parse(line), time.monotonic()
            last = ev or last
            if ev.get("started"):
                marks["started"] = now
                out["start_parts"] = ev.get("parts", {})  # the child's own clock: join, cache, engine, warm-up
                out["restart_s"] = round(now - marks["t0"], 2)
                spares.refill()
            if first_sample is None and ev.get("phase") in ("fetch", "apply", "generate"):
                marks.setdefault(ev["phase"], now)
            if "applied" in ev:
                applied.add(ev["applied"])
                marks.setdefault("applied", now)
            if "sample" in ev:  # the trainer's side of the rule: train only samples of a verified apply
                if ev["sample"] in applied:
                    out["samples"] += ev["n"]
                    if first_sample is None:
                        first_sample, marks["sample"] = ev["sample"], now
                        out["versions_behind"] = trainer.version - ev["sample"]
                else:
                    out["unverified"] += ev["n"]
            if first_sample is not None and ev.get("phase") == phase and "phase" not in marks:
                marks["phase"] = now
                time.sleep(delay)
                marks["kill"] = time.monotonic()
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        watchdog.cancel()
        proc.wait(timeout=60)
        marks["reaped"] = time.monotonic()
        rest = [e for e in map(parse, proc.stdout.read().splitlines()) if e]  # lines written before it died
    last = rest[-1] if rest else last
    out["hung"] = int(hung.is_set())
    out["exit"] = proc.returncode  # -9: our SIGKILL; anything else: the engine died on its own
    out["killed_in"] = last.get("phase") or ("after_apply" if "applied" in last else "after_generate")
    out["split"] = _split(marks)
    out["trial_s"] = round(marks["reaped"] - marks["t0"], 2)
    out["load_1m"] = round(os.getloadavg()[0], 2)
    return out
