"""Issue 20 on the real loop: a 2-rank DeepSpeed ZeRO-3 trainer (Ray actors, gloo) publishes each rank's live
partition (`trainer.publish=auto` resolves to sharded), rollout workers read whole tensors through
`ReshardReader.read_whole`, and GRPO still learns.

Bytes per source, from every fetch event: no trainer rank ever served more than its own partition (plus its
layout record) to one read, both ranks served, and no rank gathered a full copy (`sync/trainer_gathered_bytes`).
"""
import json

import pytest

from rlsync.config.compose import route_of
from rlsync.driver import Driver
from rlsync.telemetry.loggers import read_jsonl


def _fetches(run_dir):
    trace = json.load(open(f"{run_dir}/trace.json"))["traceEvents"]
    return [e["args"] for e in trace if e.get("name") == "fetch" and e.get("ph") == "i"]


def _partition_bytes(cfg) -> tuple[int, int]:
    """(model bytes, most bytes one rank publishes: its partitions without padding + its layout record)."""
    from rlsync.hub.reshard.layout import record
    from rlsync.workers.policy import build_policy
    from rlsync.sync.hub_sharded import reader_layout

    model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
    layout = reader_layout(model, cfg.trainer.world_size)
    per_rank = [sum(p.length * 4 for p in pieces) + len(record(layout, r)) for r, pieces in enumerate(layout.ranks)]
    return sum(p.numel() * 4 for p in model.parameters()), max(per_rank)


@pytest.mark.timeout(600)
def test_zero3_ranks_publish_partitions_readers_reshard_and_grpo_learns(ray_address, tiny_cfg):
    cfg = tiny_cfg(steps=50, **{"trainer.backend": "deepspeed", "trainer.zero_stage": 3, "trainer.world_size": 2,
                                "rollout.max_staleness": 1})
    cfg.rollout.prompts_per_step, cfg.rollout.group_size = 16, 8
    cfg.pools["main"].size = 2
    cfg.trainer.algo.optimizer.lr = 2e-3
    cfg.task.name, cfg.task.args = "successor", {"length": 2, "symbols": "abcdef"}  # learns in tens of steps
    assert route_of(cfg).name == "hub_sharded"
    Driver(cfg, cfg.run_dir).run()
    rows = read_jsonl(f"{cfg.run_dir}/metrics.jsonl")
    assert [r["version"] for r in rows] == list(range(1, 51))
    # No rank gathered a copy of the model for the hub, at any step.
    assert all(r["sync/trainer_gathered_bytes"] == 0 for r in rows)
    model_bytes, most = _partition_bytes(cfg)
    fetches = _fetches(cfg.run_dir)
    readers = {str(f["wid"]) for f in fetches}
    trainer_srcs = set()
    for f in fetches:
        by = {str(w): n for w, n in f["bytes_by_source"].items() if n > 0}
        assert sum(by.values()) >= model_bytes, f  # whole tensors: every shard (+ records)
        for w, n in by.items():
            if w not in readers:  # a trainer rank
                trainer_srcs.add(w)
                assert n <= most < 0.6 * model_bytes, (w, n, most, model_bytes)
    assert len(trainer_srcs) == 2, trainer_srcs
    # GRPO learns through the resharded weights: the last 10 steps clearly above the first 5.
    r = [row["reward/mean"] for row in rows]
    assert sum(r[-10:]) / 10 > sum(r[:5]) / 5 + 0.15, r
