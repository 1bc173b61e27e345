"""Bring your own code: `plugins=[my_task]` registers a user's task and reward in the driver and every worker.

The user's module is `examples/my_task.py`, copied into a directory of the test's own (the user's
working directory); the installed package is not touched. The run joins the session's Ray cluster.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlsync.telemetry.loggers import read_jsonl

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_task.py"


def _train(cwd, *args, timeout=240, **env_extra):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", **env_extra}
    return subprocess.run([sys.executable, "-m", "rlsync.train", "+recipe=tests/tiny_e2e", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(420)  # the session's Ray cluster start plus one 3-step run: ~40 s idle, minutes when shared
def test_a_task_and_reward_from_the_users_own_module_reach_every_worker(ray_address, tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "my_task.py")
    run_dir, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    p = _train(tmp_path, "plugins=[my_task]", "task.name=sort", "run_dir=run", f"ray.address={ray_address}",
               "logging.wandb.enabled=false", TMPDIR=str(tmp))
    assert p.returncode == 0, p.stderr[-3000:]
    assert not list(tmp.glob("rlsync-hub-*")), list(tmp.iterdir())   # the hub's journal dir went with the run
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]          # rollout workers scored with `sorted_prefix`
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)


@pytest.mark.timeout(60)
def test_an_unknown_plugin_or_a_task_only_a_plugin_knows_fails_before_ray_starts(tmp_path):
    p = _train(tmp_path, "plugins=[no_such_module]", f"run_dir={tmp_path / 'run'}")
    assert p.returncode != 0 and "plugins: no module 'no_such_module'" in p.stderr, p.stderr[-2000:]
    p = _train(tmp_path, "task.name=sort", f"run_dir={tmp_path / 'run'}")      # my_task not loaded
    assert p.returncode != 0 and "task.name" in p.stderr and "sort" in p.stderr, p.stderr[-2000:]
    assert "Started a local Ray instance" not in p.stderr
