"""`bench chaos_vllm --kill hub`: the hub, a process of its own, killed by SIGKILL while a real vLLM engine fetches
or applies a version, and restarted on the same address and journal (docs/benchmarks.md, "chaos_vllm").

The engine (rlsync/bench/_chaos_vllm_child.py) is started once and must go on by itself: its hub client keeps
retrying an unreachable hub (`ClientConfig.hub_deadline_s`) and re-joins the restarted one, which knows every
committed version from its journal and learns the replicas again as workers re-register (docs/architecture.md,
"Hub failover"). Each trial: a seeded phase (fetch | apply) and delay in [0, 0.3] s; when the engine announces that
phase the hub is killed after the delay and restarted; the trial ends at the engine's first sample of that version
or a newer one (none within `HANG_S`: an engine hang). An engine process that dies is counted and started again.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from ._chaos_vllm_child import parse

log = logging.getLogger(__name__)
HANG_S = 120.0


class HubProcess:
    """`python -m rlsync.hub serve` on a fixed port; `kill_and_restart` SIGKILLs it and starts it again."""

    def __init__(self, worker_timeout_s: float = 3.0):
        from rlsync.trainer import free_port

        self.tmp = tempfile.mkdtemp(prefix="rlsync-chaos-hub-")
        self.port, self.worker_timeout_s = free_port(), worker_timeout_s
        self.log = open(os.path.join(self.tmp, "hub.log"), "a")
        self.proc, self.address, self.token = self._start()

    def _start(self):
        from rlsync.hub.tools.demo import start_hub_process

        return start_hub_process(self.tmp, port=self.port, worker_timeout_s=self.worker_timeout_s, stderr=self.log)

    def kill_and_restart(self) -> float:
        """SIGKILL, then a new process on the same address and journal; the seconds until it listens again."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc, _, _ = self._start()
        return time.monotonic() - t0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Victim:
    """The engine process; a thread reads its JSON lines into `events` (time, line)."""

    def __init__(self, address: str, token: str, model_dir: str):
        self.args, self.env = (address, model_dir), dict(os.environ, RLSYNC_HUB_TOKEN=token)
        self.cond = threading.Condition()
        self.events: list[tuple[float, dict]] = []
        self.applied: set[int] = set()
        self.samples = self.unverified = self.deaths = 0
        self._closing = False
        self._spawn()

    def _spawn(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "rlsync.bench._chaos_vllm_child", *self.args, "victim"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True, name="chaos-victim").start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            ev = parse(line)
            if not ev:
                continue
            with self.cond:
                if "applied" in ev:
                    self.applied.add(ev["applied"])
                if "sample" in ev:  # the trainer's rule: only samples of a verified apply are trained
                    if ev["sample"] in self.applied:
                        self.samples += ev["n"]
                    else:
                        self.unverified += ev["n"]
                self.events.append((time.monotonic(), ev))
                self.cond.notify_all()
        proc.wait()
        with self.cond:
            if not self._closing:  # died on its own: counted, and a new one goes on with the bench
                self.deaths += 1
                log.warning("the engine process died (exit %s): starting another", proc.returncode)
                self._spawn()

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def wait(self, pred, since: int, timeout_s: float) -> tuple[float, dict] | None:
        """The first event from index `since` on that `pred` accepts (None after `timeout_s`)."""
        end = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for t, ev in self.events[since:]:
                    if pred(ev):
                        return t, ev
                since = len(self.events)
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def last(self) -> dict:
        with self.cond:
            return self.events[-1][1] if self.events else {}

    def close(self) -> None:
        with self.cond:
            self._closing = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def hub_trial(rng, hub: HubProcess, victim: Victim, trainer) -> dict:
    phase, delay = rng.choice(["fetch", "apply"]), rng.uniform(0.0, 0.3)
    t0 = time.monotonic()
    out = {"phase": phase, "delay_s": round(delay, 3), "hung": 0}
    got = victim.wait(lambda e: e.get("phase") == phase, victim.mark(), HANG_S)
    if got is None:
        out.update(hung=1, killed_in="none", trial_s=round(time.monotonic() - t0, 2),
                   load_1m=round(os.getloadavg()[0], 2))
        return out
    want = got[1]["version"]
    time.sleep(delay)
    last = victim.last()
    out["killed_in"] = last.get("phase") or ("after_apply" if "applied" in last else "after_generate")
    since, t_kill = victim.mark(), time.monotonic()
    out["hub_down_s"] = round(hub.kill_and_restart(), 2)
    back = victim.wait(lambda e: "sample" in e and e["sample"] >= want, since, HANG_S)
    if back is None:
        out["hung"] = 1
    else:
        out["kill_to_sample_s"] = round(back[0] - t_kill, 2)
        out["versions_behind"] = trainer.version - back[1]["sample"]
    out["trial_s"] = round(time.monotonic() - t0, 2)
    out["load_1m"] = round(os.getloadavg()[0], 2)
    return out

