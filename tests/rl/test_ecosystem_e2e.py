"""End to end with one override: a reasoning-gym generator and a multi-turn verifiers environment run through
the real `python -m rlsync.train` (tiny model, 2 steps, held-out eval), scored by their own scorer / rubric."""
import os
import subprocess
import sys

import pytest

from rlsync.telemetry.loggers import read_jsonl


def _train(tmp_path, ray_address, *task):
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    p = subprocess.run([sys.executable, "-m", "rlsync.train", "+recipe=tests/tiny_e2e", *task, f"run_dir={run_dir}",
                        "steps=2", "checkpoint.every=0", "eval.every=2", "eval.prompts=4",
                        "logging.wandb.enabled=false", f"ray.address={ray_address}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in train)
    gaps = [r["rollout/logprob_gap"] for r in train if r["rollout/logprob_gap"] is not None]  # None: no fresh sample
    assert gaps and all(abs(g) < 1e-4 for g in gaps)                          # behaviour log-probs = the trainer's
    evals = [r for r in rows if "eval/reward_mean" in r]
    assert [r["step"] for r in evals] == [0, 2]
    return evals


@pytest.mark.timeout(420)
def test_a_reasoning_gym_generator_by_one_override(ray_address, tmp_path):
    _train(tmp_path, ray_address, "task.name=reasoning_gym", "task.args.dataset=basic_arithmetic")


@pytest.mark.timeout(420)
def test_a_multi_turn_verifiers_environment_by_one_override(ray_address, tmp_path):
    evals = _train(tmp_path, ray_address, "task.name=verifiers", "task.args.env=rlsync_arithmetic_retry")
    # a wrong first reply gets a second turn: more model tokens than one turn's budget (32) can hold
    assert all(r["eval/mean_response_tokens"] > 32 for r in evals)
