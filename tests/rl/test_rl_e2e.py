"""End to end: the real `python -m rlsync.train +recipe=tests/tiny_e2e` in a subprocess, from a foreign directory.

It joins the session's Ray cluster (`ray.address=...`, the path a user takes with an existing
cluster) to skip a second cluster start-up, and runs the recipe's 3 steps with wandb offline. The same run's
completions and rollout workers' logs are checked too (tests/rl/run_checks.py; a run of their own cost ~24 CPU-s).
"""
import json
import os
import subprocess
import sys

from rlsync.telemetry.loggers import read_jsonl

from run_checks import check_completions_and_worker_logs  # tests/rl/run_checks.py


def test_train_cli_runs_a_tiny_recipe_and_leaves_metrics_trace_wandb_checkpoints_and_completions(ray_address, tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "1"}
    p = subprocess.run([sys.executable, "-m", "rlsync.train", "+recipe=tests/tiny_e2e", f"hydra.run.dir={run_dir}",
                        f"ray.address={ray_address}", "logging.completions_per_step=3"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["version"] for r in rows] == [1, 2, 3]
    for key in ("reward/mean", "loss/policy", "kl", "staleness/mean", "staleness/dropped",
                "staleness/generated", "timing_s/step",
                "stall/rollout_wait_weights_s", "stall/trainer_wait_data_s", "stall/trainer_wait_release_s",
                "stall/total_s", "sync/bytes", "sync/gbps", "hub/replicas", "hub/retained_versions", "hub/plan_ms",
                "hub/rpc_per_s", "hub/heartbeat_lag_ms"):
        assert key in rows[0], key
    assert all(r["ray/weight_like_tensors"] == 0 for r in rows)
    assert sum(r["sync/bytes"] for r in rows) > 0
    assert all(0 <= r["staleness/max"] <= 4 for r in rows)  # the default cap, max(max_staleness=1, 4)
    trace = json.load(open(run_dir / "trace.json"))
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"trainer-0", "main-0", "main-1"} <= tracks
    assert any(d.startswith("offline-run-") for d in os.listdir(run_dir / "wandb"))
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["step_0000002", "step_0000003"]
    # the end-of-run table on stdout (rlsync/telemetry/summary.py): status, steps, the rewards of these rows
    table = {cells[0]: cells[1] for line in p.stdout.splitlines()
             if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2}
    assert table["status"] == "done" and table["steps"] == "3", p.stdout
    assert table["reward, first / last step"] == f"{rows[0]['reward/mean']:.3f} -> {rows[-1]['reward/mean']:.3f}"
    assert "all stall" in table and "wall time" in table, p.stdout

    from rlsync.telemetry.report import build_report

    html = build_report(run_dir)
    assert html.exists() and (run_dir / "report" / "reward.png").exists()
    check_completions_and_worker_logs(run_dir, steps=(1, 2, 3), per_step=3)
