"""`python -m rlsync.train`'s own surface: where its log goes, one-line errors, `--cfg job`, `--help`."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.timeout(180)  # one interpreter start: ~5 s idle, ~20 s at load 30
def test_run_dir_holds_train_log_and_a_misspelt_reward_in_task_args_is_one_line(tmp_path):
    """`run_dir=X` (the README's attach form) is Hydra's run dir too: train.log lands in X, no runs/<date>/ folder."""
    run = tmp_path / "job"
    p = subprocess.run([sys.executable, "-m", "rlsync.train", "+recipe=tests/tiny_e2e", f"run_dir={run}",
                        "+task.args.reward=partial_mtch"], capture_output=True, text=True, timeout=150, cwd=tmp_path,
                       env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: task.args.reward: unknown reward 'partial_mtch'; known: "), p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert (run / "train.log").is_file() and not (tmp_path / "runs").exists()


def test_cfg_job_prints_the_task_args_and_plugin_path_the_run_uses(capsys, monkeypatch):
    from rlsync.train import print_job_config

    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the plugin's directory goes on it
    from rlsync.rollout.rewards import REWARDS
    from rlsync.rollout.tasks import TASKS
    for reg in (TASKS, REWARDS):  # the plugin registers 'sort' here: gone after this test, for the others in this process
        monkeypatch.setattr(reg, "_table", dict(reg._table))
    try:
        print_job_config(["+recipe=grpo_standalone", "plugins=[my_task]", "task.name=sort"])
    finally:
        sys.modules.pop("my_task", None)
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["plugin_path"] == [str(EXAMPLES)]
    assert cfg["task"]["args"] == {"reward": "sorted_prefix", "symbols": "0123456789", "length": 3}
    assert cfg["task"]["seed"] == 0 and cfg["steps"] == 200


def test_help_lists_every_key_with_its_default_and_declared_doc():
    from rlsync.config.help import help_text

    lines = help_text().splitlines()
    assert "  steps: int = 200  Trainer steps (= versions published after the initial one)." in lines
    assert any(ln.startswith("  deterministic: bool = False  True: the same per-step rewards") for ln in lines)
    assert any(ln.startswith("  pools.<name>.size: int = 1  Rollout worker actors") for ln in lines)
    assert any(ln.startswith("  trainer.algo.optimizer.lr: ") for ln in lines)
    assert any(ln.startswith("  hub.server.planner.") for ln in lines)
