"""Completions you can read: a bounded sample per step in RUN_DIR/completions.jsonl and a wandb table."""

import json

import pytest

from rlsync.telemetry.completions import COMPLETION_COLUMNS, Completion, CompletionSample, pick_samples, trained_prompts
from rlsync.telemetry.loggers import RUN_CONFIG_FILE, LoggingConfig, WandbLogger, make_logger, read_jsonl


def _c(i: int, **kw) -> Completion:
    return Completion(prompt=f"p{i}", response=f"r{i}", reward=i / 10, version=3, worker="main-0", **kw)


def test_pick_samples_takes_one_per_prompt_group_first():
    assert pick_samples(n_samples=12, group_size=4, k=3) == [0, 4, 8]
    assert pick_samples(n_samples=12, group_size=4, k=5) == [0, 4, 8, 1, 5]
    assert pick_samples(n_samples=4, group_size=4, k=9) == [0, 1, 2, 3]
    assert pick_samples(n_samples=8, group_size=4, k=0) == []


def test_a_step_takes_completions_of_the_prompts_it_trained_on_one_per_prompt_first():
    s = CompletionSample(per_step=3)
    s.add([_c(0, prompt_index=0), _c(1, prompt_index=0), _c(2, prompt_index=1)])
    s.add([_c(3, prompt_index=2), _c(4, prompt_index=5)])
    rows = s.take([2, 0, 0, 9])  # trained: prompts 2 and 0 (9 has no completion here)
    assert [r["prompt"] for r in rows] == ["p3", "p0", "p1"]  # one per prompt first, then a second of prompt 0
    assert set(rows[0]) | {"step"} == set(COMPLETION_COLUMNS)
    assert s.take([0, 2]) == []  # taken: gone
    assert [r["prompt"] for r in s.take([1, 5])] == ["p2", "p4"]
    off = CompletionSample(per_step=0)
    off.add([_c(0, prompt_index=0)])
    assert off.take([0]) == []


def test_completions_of_prompts_never_trained_on_age_out():
    s = CompletionSample(per_step=2, pool=4)
    s.add([_c(i, prompt_index=i) for i in range(6)])  # prompts 0 and 1 (the oldest) age out
    assert s.take([0, 1]) == [] and [r["prompt"] for r in s.take([5, 4, 3])] == ["p5", "p4"]


def test_trained_prompts_reads_each_groups_prompt_index():
    import torch
    from rlsync.core.batch import Batch
    groups = [Batch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3),
                    response_mask=torch.ones(2, 3), old_logprobs=torch.zeros(2, 3), rewards=torch.zeros(2),
                    versions=torch.zeros(2, dtype=torch.long), group_ids=torch.full((2,), p)) for p in (7, 3)]
    assert trained_prompts(groups) == [7, 3]


def test_rows_land_in_completions_jsonl_with_their_step(tmp_path):
    lg = make_logger({"run_dir": str(tmp_path), "wandb": {"enabled": False}}, run_config={"steps": 2})
    lg.log_rows("completions", [_c(1).row(), _c(2, version_spans=[(2, 0, 3), (3, 3, 5)]).row()], step=7)
    lg.log_rows("completions", [], step=8)  # nothing sampled: no line
    lg.close()
    rows = read_jsonl(tmp_path / "completions.jsonl")
    assert [(r["step"], r["prompt"], r["reward"], r["version"]) for r in rows] == [(7, "p1", 0.1, 3), (7, "p2", 0.2, 3)]
    assert rows[0]["version_spans"] is None and rows[1]["version_spans"] == [[2, 0, 3], [3, 3, 5]]
    assert json.loads((tmp_path / RUN_CONFIG_FILE).read_text()) == {"steps": 2}  # what export rebuilds from


@pytest.mark.timeout(90)
def test_wandb_offline_gets_a_completions_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = make_logger(LoggingConfig(run_dir=str(tmp_path), wandb=WandbLogger.Config(mode="offline")))
    lg.log({"reward/mean": 0.5}, step=1)
    lg.log_rows("completions", [_c(1).row(), _c(2, version_spans=[(2, 0, 3)]).row()], step=1)
    lg.close()
    tables = list((tmp_path / "wandb").glob("offline-run-*/files/media/table/completions_1_*.table.json"))
    assert len(tables) == 1
    t = json.loads(tables[0].read_text())
    assert t["columns"] == list(COMPLETION_COLUMNS)
    assert [row[1:4] for row in t["data"]] == [["p1", "r1", 0.1], ["p2", "r2", 0.2]]
    assert t["data"][1][-1] == "[[2,0,3]]"  # one type per column: spans as JSON text
