"""`bench chaos_vllm --kill engine`: one trial = the live vLLM engine process killed by SIGKILL, a new one started.

The bench starts a first engine and waits for its first sample (`Live.start`: not a trial, not a restart). Each
trial then waits for the live engine's seeded phase (fetch | apply | generate) of a later version, waits the seeded
delay and kills it; takes a new engine process (the spare kept imported and waiting, or a fresh one) and ends at
that engine's first sample of a verified version: the rejoin, measured on a restarted engine only. The restarted
engine is the live one of the next trial. Every child line's arrival time is kept, so a trial's wall splits into its
parts (`split`): `to_kill_phase` (waiting for the trainer's next version, then to the phase), `delay`, `reap`
(SIGKILL -> the process gone), `spare_wait` (the spare's imports not done yet), `engine_start` ("go" -> started:
join, the start-up cache, vLLM's engine set-up with dummy weights, one warm-up batch; `start_parts` splits it by the child's own
clock), `join_to_fetch`, `first_fetch`, `first_apply_check` (apply + the receiver's checks), `to_generate` and
`first_generate`.

Rejoin within one version: `versions_behind` = the trainer's latest version when the restarted engine's first
sample (of a verified apply) arrives, minus that sample's version; the rejoin holds when it is <= 1.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
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
        fd, self.log_path = tempfile.mkstemp(prefix="rlsync-chaos-engines-", suffix=".log")
        self.log = os.fdopen(fd, "ab")  # every engine process's stderr (vLLM's log, a traceback), for diagnosis

    def take(self) -> tuple[subprocess.Popen, float]:
        """A started engine process: the spare (waiting for its imports if they are not done) or a fresh one;
        the seconds waited for the spare."""
        if not self.use:
            return subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.log, text=True,
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
                                stderr=self.log, text=True, env=self.env)

    def refill(self) -> None:
        if self.use and self.spare is None:
            self.spare = self._spawn()

    def close(self) -> None:
        if self.spare is not None:
            self.spare.kill()
            self.spare.wait()
        self.log.close()


ORDER = ["t0", "phase", "kill", "reaped", "taken", "started", "fetch", "apply", "applied", "generate", "sample"]
PARTS = ["to_kill_phase", "delay", "reap", "spare_wait", "engine_start", "join_to_fetch", "first_fetch",
         "first_apply_check", "to_generate", "first_generate"]


def _split(marks: dict[str, float]) -> dict[str, float]:
    """Consecutive differences of the trial's marks, in order; a part whose end never came is left out."""
    return {name: round(marks[b] - marks[a], 2) for name, a, b in zip(PARTS, ORDER, ORDER[1:])
            if a in marks and b in marks}


class Live:
    """The engine process in service and what the bench read from it: reading resumes where it stopped."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.applied, self.last = proc, set(), {}

    def read(self, until, marks: dict, out: dict, trainer, spares: "Spares") -> dict | None:
        """Lines up to the first that `until` accepts (that line; None if the process ended first). Marks the
        first started / fetch / apply / applied / generate / sample; a sample of a version without its verified
        apply is counted in `unverified` (the trainer drops it), one with it in `samples`."""
        for line in self.proc.stdout:
            ev, now = parse(line), time.monotonic()
            self.last = ev or self.last
            if ev.get("started"):
                marks["started"] = now
                out["restart_s"] = round(now - marks.get("reaped", marks["t0"]), 2)
                out["start_parts"] = ev.get("parts", {})  # the child's own clock: join, cache, engine
                spares.refill()
            if ev.get("phase") in ("fetch", "apply", "generate"):
                marks.setdefault(ev["phase"], now)
            if "applied" in ev:
                self.applied.add(ev["applied"])
                marks.setdefault("applied", now)
            if "sample" in ev:  # the trainer's side of the rule: train only samples of a verified apply
                if ev["sample"] in self.applied:
                    out["samples"] += ev["n"]
                    marks.setdefault("sample", now)
                    out.setdefault("versions_behind", trainer.version - ev["sample"])
                else:
                    out["unverified"] += ev["n"]
            if until(ev):
                return ev
        return None

    @classmethod
    def start(cls, spares: "Spares", trainer) -> "Live":
        """The first engine: started and sampled before any trial."""
        proc, _ = spares.take()
        live, out = cls(proc), {"samples": 0, "unverified": 0}
        if live.read(lambda e: "sample" in e and e["sample"] in live.applied, {"t0": time.monotonic()}, out,
                     trainer, spares) is None:
            raise RuntimeError(f"the first engine process ended (exit {proc.wait()}) before its first sample")
        return live


def _hang_guard(proc_of, hung: threading.Event) -> threading.Timer:
    def on_hang():
        hung.set()
        proc_of().kill()

    t = threading.Timer(TRIAL_HANG_S, on_hang)  # a silent child must not stall the bench
    t.start()
    return t


def engine_trial(rng, spares: Spares, trainer, live: Live) -> tuple[dict, Live]:
    """One trial: kill `live` at the seeded point, restart, wait for the rejoin. Its record (phase, delay, samples,
    versions_behind, split, trial_s, load_1m, ...) and the restarted engine, live for the next trial."""
    phase, delay = rng.choice(["fetch", "apply", "generate"]), rng.uniform(0.0, 0.3)
    marks = {"t0": time.monotonic()}
    out = {"phase": phase, "delay_s": round(delay, 3), "unverified": 0, "samples": 0, "hung": 0}
    hung, current = threading.Event(), [live.proc]
    watchdog = _hang_guard(lambda: current[0], hung)
    try:
        # the kill: the live engine's seeded phase of a version after the one it already sampled
        before = {"samples": 0, "unverified": 0}  # none expected: the phase comes before the next sample
        if live.read(lambda e: e.get("phase") == phase, {}, before, trainer, spares):
            marks["phase"] = time.monotonic()
            time.sleep(delay)
            marks["kill"] = time.monotonic()
            live.proc.send_signal(signal.SIGKILL)
        out["samples"], out["unverified"] = before["samples"], before["unverified"]
        live.proc.wait(timeout=60)
        marks["reaped"] = time.monotonic()
        rest = [e for e in map(parse, live.proc.stdout.read().splitlines()) if e]  # written before it died
        last = rest[-1] if rest else live.last
        out["exit"] = live.proc.returncode  # -9: our SIGKILL; anything else: the engine died on its own
        out["killed_in"] = last.get("phase") or ("after_apply" if "applied" in last else "after_generate")
        # the restart and the rejoin
        proc, spare_wait = spares.take()
        marks["taken"], out["spare_wait_s"] = time.monotonic(), round(spare_wait, 2)
        new = Live(proc)
        current[0] = proc
        new.read(lambda e: "sample" in e and e["sample"] in new.applied, marks, out, trainer, spares)
    finally:
        watchdog.cancel()
    out["hung"] = int(hung.is_set())
    out["split"] = _split(marks)
    out["trial_s"] = round(time.monotonic() - marks["t0"], 2)
    out["load_1m"] = round(os.getloadavg()[0], 2)
    return out, new
