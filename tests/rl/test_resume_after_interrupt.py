"""Ctrl-C, then `resume=auto`, keeps the record (issue 36 item 4): a real run on the session's Ray cluster
interrupted with SIGINT mid-run (rlsync/driver/interrupt.py's handler, as `python -m rlsync.train` installs it),
then resumed. The checkpoint is the one Ctrl-C wrote (cadence off), at the last finished step; the metrics hold
each step once; the trace holds both parts on one timeline; the summary names the resumed part.
(Dropping rows of steps trained again after a crash, and a trace cut mid-event: tests/telemetry/test_resumed_record.py.)
"""
import json
import os
import signal
import threading

import pytest

from rlsync.driver import Driver
from rlsync.driver.checkpoint import CheckpointStore
from rlsync.driver.interrupt import GracefulStop
from rlsync.telemetry.loggers import read_jsonl
from rlsync.telemetry.summary import summarize_run

from waiting import wait_for  # tests/waiting.py


def _steps(run_dir):
    path = f"{run_dir}/metrics.jsonl"
    return [r["step"] for r in read_jsonl(path) if "version" in r] if os.path.exists(path) else []


def _run_and_interrupt(driver, run_dir, after_steps):
    """driver.run() under the CLI's Ctrl-C handler; SIGINT to this process once `after_steps` steps are logged."""
    sender = threading.Thread(target=lambda: (
        wait_for(lambda: len(_steps(run_dir)) >= after_steps, 240, f"{after_steps} steps logged", every_s=0.1),
        os.kill(os.getpid(), signal.SIGINT)), daemon=True)
    stop = GracefulStop(driver, run_dir, deadline_s=600)
    try:
        with stop:
            sender.start()
            driver.run()
    finally:
        if stop._timer is not None:
            stop._timer.cancel()  # the CLI keeps its deadline until exit; this test process lives on
        for sig, handler in stop._previous.items():
            signal.signal(sig, handler)
        sender.join(timeout=5)
    return stop.signalled


@pytest.mark.timeout(600)
def test_ctrl_c_then_resume_auto_keeps_every_step_once_and_both_parts_of_the_trace(ray_address, tiny_cfg):
    over = {"checkpoint.enabled": True, "checkpoint.every": 0, "eval.every": 2, "eval.prompts": 4,
            "inject.generate_delay_s": 0.05}
    cfg = tiny_cfg(steps=200, **over)
    run_dir = cfg.run_dir
    assert _run_and_interrupt(Driver(cfg, run_dir), run_dir, after_steps=3) == "SIGINT"
    first = _steps(run_dir)
    stopped_at = first[-1]
    assert first == list(range(1, stopped_at + 1)) and stopped_at < 200, first
    # Ctrl-C wrote a checkpoint at the step boundary (cadence is off: only Ctrl-C writes one before step 200)
    _, state = CheckpointStore(f"{run_dir}/checkpoints").latest()
    assert state["step"] == state["version"] == stopped_at
    cursor = state["task"]["cursor"]
    assert cursor >= read_jsonl(f"{run_dir}/metrics.jsonl")[-1]["data/cursor"]  # past every prompt handed out

    cfg2 = tiny_cfg(steps=stopped_at + 3, resume="auto", **over)
    Driver(cfg2, run_dir).run()
    rows = read_jsonl(f"{run_dir}/metrics.jsonl")
    every = [r["step"] for r in rows]
    assert len(every) == len(set(every)), every  # no step twice (evals included)
    assert _steps(run_dir) == list(range(1, stopped_at + 4))  # and none lost
    resumed = [r for r in rows if r["step"] > stopped_at]
    assert [r["version"] for r in resumed] == [stopped_at + 1, stopped_at + 2, stopped_at + 3]
    # prompts from the saved cursor on (4 per request), and the end-of-run checkpoint at the last step
    assert resumed[0]["data/cursor"] > cursor and (resumed[0]["data/cursor"] - cursor) % 4 == 0
    path, state = CheckpointStore(f"{run_dir}/checkpoints").latest()
    assert state["step"] == stopped_at + 3 and path.name == f"step_{stopped_at + 3:07d}"

    trace = json.loads(open(f"{run_dir}/trace.json").read())  # one file, strict JSON, both parts
    steps = [e["args"]["step"] for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert steps == list(range(1, stopped_at + 4)), steps
    mark = [e for e in trace["traceEvents"] if e.get("cat") == "resume"]
    assert [e["args"]["resumed_from_step"] for e in mark] == [stopped_at]
    worker_slices = [e["ts"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "state"]
    assert min(worker_slices) < mark[0]["ts"] < max(worker_slices)  # the workers' tracks of both parts

    sections = summarize_run(run_dir, None, wall_s=None)
    assert dict(sections["learning"])["resumed from step"] == str(stopped_at)
    items = dict(sections["time"])
    assert f"part 2: steps {stopped_at + 1}-{stopped_at + 3}, resumed from step {stopped_at}" in items, items
