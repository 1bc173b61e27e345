"""sync.mode object_store and broadcast: real Ray object store / real gloo group, the same loop and metrics."""
import json
from collections import Counter

import pytest

from rlsync.driver import Driver
from rlsync.telemetry.loggers import read_jsonl

MODEL_BYTES = 4 * 133_440  # the tiny Llama (hidden 64, 2 layers, vocab 16) in fp32


def _fetch_sources(run_dir):
    trace = json.load(open(f"{run_dir}/trace.json"))
    return [e["args"] for e in trace["traceEvents"] if e.get("name") == "fetch" and e.get("ph") == "i"]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["object_store", "broadcast"])
def test_mode_moves_every_version_through_its_channel_and_logs_eval(ray_address, tiny_cfg, mode):
    cfg = tiny_cfg(steps=3, timeout_s=300, **{"sync.mode": mode, "eval.every": 2, "eval.prompts": 8})
    cfg.pools["main"].size = 2
    Driver(cfg, cfg.run_dir).run()
    rows = read_jsonl(f"{cfg.run_dir}/metrics.jsonl")
    steps = [r for r in rows if "version" in r]
    assert [r["version"] for r in steps] == [1, 2, 3]
    assert all(r["ray/weight_like_tensors"] == 0 for r in steps)  # refs and collectives, not call payloads
    fetches = _fetch_sources(cfg.run_dir)
    assert fetches and all(set(f["bytes_by_source"]) == {mode} for f in fetches)
    assert all(f["bytes"] == MODEL_BYTES for f in fetches)
    if mode == "broadcast":  # both engines receive every version (the last one's after the last step closes)
        assert Counter(f["version"] for f in fetches if f["version"] < 3) == {0: 2, 1: 2, 2: 2}
    # the trainer's side of the sync is on its clock (gather + put, or the collective)
    assert sum(r["stall/trainer_offload_s"] for r in steps) > 0
    evals = [r for r in rows if "eval/reward_mean" in r]
    assert [r["step"] for r in evals] == [0, 2, 3]
    assert all(0.0 <= r["eval/reward_mean"] <= 1.0 for r in evals)


def test_broadcast_refuses_a_pool_that_can_change_size(tiny_cfg):
    from rlsync.config.compose import check_config
    from rlsync.sync import SyncModeError

    cfg = tiny_cfg(**{"sync.mode": "broadcast"})
    cfg.pools["main"].policy = "spot"
    with pytest.raises(SyncModeError, match="static group"):
        check_config(cfg)
    cfg.sync.mode = "carrier_pigeon"
    with pytest.raises(SyncModeError, match="known: broadcast, hub, object_store"):
        check_config(cfg)


@pytest.mark.timeout(400)
def test_hub_deltas_bring_an_engine_forward_by_delta(ray_address, tiny_cfg):
    """sync.deltas: the trainer publishes each version's delta; the engine, holding the previous version,
    takes it (the hub told to always prefer a chain: on one host its estimate picks the full copy)."""
    cfg = tiny_cfg(steps=3, timeout_s=300, **{"sync.deltas": True})
    cfg.hub.server.delta.mode = "always"
    Driver(cfg, cfg.run_dir).run()
    rows = read_jsonl(f"{cfg.run_dir}/metrics.jsonl")
    assert [r["version"] for r in rows if "version" in r] == [1, 2, 3]
    fetches = _fetch_sources(cfg.run_dir)
    deltas = [f for f in fetches if f["mode"] == "delta"]
    assert deltas and all(0 < f["bytes"] < MODEL_BYTES for f in deltas)   # verified against v's checksums
    assert all(f["mode"] == "full" and f["bytes"] == MODEL_BYTES for f in fetches if f not in deltas)
