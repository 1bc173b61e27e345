"""Issue 9: the elastic trainer group on real Ray actors — lose a rank, go on; add one, use it.

Weights of the re-formed group come from the hub (rollout replicas), never from disk, and equal the
last committed version bit for bit (sha256 of the loaded tensors vs the digest taken at its publish).
"""
import json
from pathlib import Path

import pytest

from rlsync.driver import Driver
from rlsync.workers.elastic import TrainerChurnConfig, split_groups
from rlsync.telemetry.loggers import read_jsonl


def test_split_groups_whole_groups_as_even_as_possible():
    assert split_groups(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_groups(list(range(4)), 1) == [[0, 1, 2, 3]]
    with pytest.raises(ValueError):
        split_groups([1], 2)
    c = TrainerChurnConfig(kill_at=[3, 3], join_at=[5])
    assert (c.kills_during(3), c.kills_during(4), c.joins_after(5)) == (2, 0, 1)


def _elastic_cfg(tiny_cfg, steps=40, prompts=32, **over):
    cfg = tiny_cfg(steps=steps, **{"trainer.world_size": 2, "trainer.elastic.enabled": True,
                                   "rollout.max_staleness": 1, **over})
    cfg.rollout.prompts_per_step, cfg.rollout.group_size = prompts, 8
    cfg.pools["main"].size = 2
    cfg.trainer.algo.optimizer.lr = 2e-3
    # An easy task (successor of 2 symbols over 6), so 40 steps learn clearly even across a loss, a re-form
    # with a fresh optimizer, and a join: single-process GRPO takes it from ~0.11 to ~0.6 in 40 steps.
    cfg.task.name, cfg.task.args = "successor", {"length": 2, "symbols": "abcdef"}
    return cfg


def _model_bytes(cfg) -> int:
    """Bytes of one full copy of the run's model, built as every worker builds it (its vocabulary
    follows the task's alphabet, so the size changes with the task)."""
    from rlsync.workers.policy import build_policy

    model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "trainer_events.jsonl").read_text().splitlines()]


@pytest.mark.timeout(400)
def test_torch_group_loses_a_rank_mid_step_then_takes_a_new_one(ray_address, tiny_cfg):
    cfg = _elastic_cfg(tiny_cfg, **{"trainer.churn.kill_at": [10], "trainer.churn.join_at": [20],
                                       "trainer.churn.wait_for_join": True})
    Driver(cfg, cfg.run_dir).run()
    rows = read_jsonl(f"{cfg.run_dir}/metrics.jsonl")
    # The run completes, every step logged once, versions strictly increasing (never published twice).
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert [r["version"] for r in rows] == list(range(1, 41))
    assert sum(r["events/trainer_lost"] for r in rows) == 1
    assert sum(r["events/trainer_joined"] for r in rows) == 1
    sizes = [r["trainer/world_size"] for r in rows]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2
    assert sum(r["timing_s/trainer_recover"] for r in rows) > 0
    # Recovery: the weights are the last committed version, bit for bit, pulled through the hub
    # from rollout replicas (no trainer served a byte of its own copy; a rank reading the same version
    # may relay it to the other), with no checkpoint on disk at all.
    loss, join = _events(cfg.run_dir)
    assert loss["event"] == "loss" and loss["world_size"] == 1 and loss["version"] == 9
    assert loss["digest"] == loss["published_digest"]
    assert join["event"] == "join" and join["world_size"] == 2 and join["digest"] == join["published_digest"]
    for ev in (loss, join):
        assert ev["from_trainers"] == 0 and all(sum(b.values()) > 0 for b in ev["bytes_by_source"])
        from_rollouts = sum(sum(b.values()) for b in ev["bytes_by_source"]) - ev["relayed_by_ranks"]
        assert from_rollouts >= _model_bytes(cfg), ev  # at least one whole copy entered from rollout replicas
        assert ev["optimizer"] == ["reinit"]
    assert not (Path(cfg.run_dir) / "checkpoints").exists()
    assert all(r["ray/weight_like_tensors"] == 0 for r in rows)
    # The model learns across the loss and the join: a rising trend over the 40 steps (least squares
    # slope), and the last 10 steps clearly above the first 5 (at least 0.15 of reward more).
    r = [row["reward/mean"] for row in rows]
    n, mx, my = len(r), (len(r) - 1) / 2, sum(r) / len(r)
    slope = sum((i - mx) * (y - my) for i, y in enumerate(r)) / sum((i - mx) ** 2 for i in range(n))
    assert slope > 0 and sum(r[-10:]) / 10 > sum(r[:5]) / 5 + 0.15, (slope, r)


@pytest.mark.timeout(400)
def test_deepspeed_zero3_group_loses_a_rank_and_takes_a_new_one(ray_address, tiny_cfg):
    """ZeRO-3 (parameters sharded): each re-form builds a new engine whose shards are cut from the hub's bytes."""
    cfg = _elastic_cfg(tiny_cfg, steps=8, prompts=8, **{"trainer.backend": "deepspeed", "trainer.zero_stage": 3,
                                             "trainer.churn.kill_at": [3], "trainer.churn.join_at": [5],
                                             "trainer.churn.wait_for_join": True, "trainer.churn.kill_rank": 0})
    Driver(cfg, cfg.run_dir).run()
    rows = read_jsonl(f"{cfg.run_dir}/metrics.jsonl")
    assert [r["version"] for r in rows] == list(range(1, 9))
    assert [r["trainer/world_size"] for r in rows] == [2, 2, 1, 1, 1, 2, 2, 2]
    assert sum(r["events/trainer_lost"] for r in rows) == 1
    loss, join = _events(cfg.run_dir)
    assert (loss["version"], loss["world_size"], join["version"], join["world_size"]) == (2, 1, 5, 2)
    for ev in (loss, join):
        assert ev["digest"] == ev["published_digest"]
    # The publisher (rank 0) was the one killed. Rank 1 held v2 as its backup replica (fetched through
    # the hub when rank 0 published it), so v2 outlived rank 0 whether or not a rollout had fetched it;
    # the survivor copied it from there. The joiner's weights came from rollout replicas.
    assert loss["members"] == ["trainer-1"] and loss["from_trainers"] == _model_bytes(cfg)
    assert join["from_trainers"] == 0
