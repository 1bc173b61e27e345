"""The loop on real Ray actors: weights only through the hub, the staleness bound. (Resume:
tests/rl/test_resume_after_interrupt.py.)"""
import json

from rlsync.driver import Driver
from rlsync.telemetry.loggers import read_jsonl


def test_no_weight_tensor_crosses_ray_and_every_fetch_goes_through_the_hub(ray_address, tiny_cfg):
    # k = 1 bounds how far ahead a request *starts*; results are taken in arrival order, so a slow call planned for
    # step t can feed step t + 1 (2 versions old: seen in a fresh-clone CI run). What bounds the trained samples is
    # the cap (rlsync/driver/staleness.py): set to k here, so "<= 1" below is the guarantee, older groups dropped.
    cfg = tiny_cfg(steps=3, **{"rollout.max_staleness": 1, "rollout.max_off_policy_versions": 1})
    cfg.pools["main"].size = 2
    Driver(cfg, cfg.run_dir).run()
    rows = read_jsonl(f"{cfg.run_dir}/metrics.jsonl")
    model_bytes = 4 * 133_440  # the tiny Llama (hidden 64, 2 layers, vocab 16) in fp32
    fetched = sum(r["sync/bytes"] for r in rows)
    assert all(r["ray/weight_like_tensors"] == 0 for r in rows)
    assert fetched >= model_bytes * 2 and fetched % model_bytes == 0     # whole models, via the hub
    assert 0 < max(r["ray/payload_bytes"] for r in rows) < model_bytes / 4   # batches only
    assert all(r["staleness/max"] <= 1 for r in rows)  # the cap: what is trained (older groups dropped, counted)
    versions = [r["version"] for r in rows]
    assert versions == sorted(set(versions))
    trace = json.load(open(f"{cfg.run_dir}/trace.json"))
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {"trainer-0", "main-0", "main-1"} <= tracks
