"""grpo_real end to end for 2 steps: SmolLM2 through vLLM (CPU), the hub the only way weights move, the
engines updated in flight (`sync.inflight=true`: staged while generating, swapped between decode steps).

The CLI as a user runs it (fresh process, its own Ray cluster). Checks: exit 0, two versions,
every engine update a hub fetch (sources are hub workers: the trainer or a peer engine), no weight
tensor in any Ray call (`ray/weight_like_tensors` 0), the engines' fetch/apply/pause and the
log-prob gap (vLLM vs the trainer on the same weights) in the metrics, each switch's decode pause
recorded, nothing dropped for staleness, the start-of-run greedy eval logged, peak RSS per worker written.
In flight, a Ray pool thread steps the engine while staging runs in another thread: this run found vLLM's
CPU attention aborting on a thread whose OpenMP count was not torch's (docs/vllm.md).
"""
import json
import os
import subprocess
import sys

import pytest

from needs import VLLM_REASON, require  # tests/needs.py

require("vllm", VLLM_REASON)


@pytest.mark.timeout(1500)
def test_grpo_real_two_steps_moves_weights_only_through_the_hub(tmp_path):
    from rlsync.telemetry.loggers import read_jsonl

    run = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "rlsync.train", "+recipe=grpo_real", "steps=2", "sync.inflight=true", "eval.prompts=4", "eval.every=2",
           "rollout.prompts_per_step=2", "rollout.group_size=4",  # 8 samples a step, not 32: 91 vs 134 CPU-s
           f"hydra.run.dir={run}", "progress=false", "logging.wandb.enabled=false", "checkpoint.enabled=false"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(run / "metrics.jsonl")
    steps = [r for r in rows if "version" in r]
    assert [r["version"] for r in steps] == [1, 2]
    assert all(r["ray/weight_like_tensors"] == 0 for r in steps)
    trace = json.load(open(run / "trace.json"))
    fetches = [e["args"] for e in trace["traceEvents"] if e.get("name") == "fetch" and e.get("ph") == "i"]
    assert fetches, "no engine ever fetched a version"
    assert all(f["bytes"] > 0 and f["bytes_by_source"] and not {"object_store", "broadcast"} & set(f["bytes_by_source"])
               for f in fetches)
    assert sum(r["sync/bytes"] for r in steps) > 0
    assert all(f["bytes"] == sum(f["bytes_by_source"].values()) for f in fetches)
    for key in ("sync/fetch_s", "sync/apply_s", "sync/pause_s"):   # the engines' update costs, per step
        assert any(r.get(key, 0) > 0 for r in steps), key
    assert any(0 <= r.get("rollout/logprob_gap", -1) < 0.2 for r in steps)  # vLLM bf16 vs trainer fp32
    updates = [e["args"] for e in trace["traceEvents"] if e.get("name") == "engine_update" and e.get("ph") == "i"]
    assert updates and all(u.get("in_flight") is not None and u["decode_pause_s"] >= 0 for u in updates)
    assert any("sync/decode_pause_s" in r for r in steps)
    assert sum(r.get("staleness/dropped", 0) for r in steps) == 0
    assert [r["step"] for r in rows if "eval/reward_mean" in r] == [0, 2]
    mem = json.load(open(run / "memory.json"))["peak_rss_mb"]
    assert {"trainer-0", "main-0", "main-1"} <= set(mem)
