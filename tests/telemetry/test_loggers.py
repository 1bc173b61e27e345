"""Loggers: JSONL always readable, wandb offline writes its run files, no-op when off."""

import json
import math
import os

import pytest

from rlsync.telemetry.loggers import (
    STALL_DASHBOARD,
    JsonlLogger,
    LoggingConfig,
    MetricLogger,
    MultiLogger,
    NullLogger,
    WandbLogger,
    apply_wandb_dashboard,
    make_logger,
    read_jsonl,
)
from rlsync.telemetry.metrics import STALL_CAUSE_KEYS


class FakeScalar:  # a torch/numpy scalar's shape
    def __init__(self, v):
        self.v = v

    def item(self):
        return self.v


def test_jsonl_rows_are_plain_json(tmp_path):
    lg = JsonlLogger(tmp_path)
    lg.log({"stall/total_s": 1.5, "reward/mean": FakeScalar(0.25), "bad": math.nan}, step=3)
    lg.log({"stall/total_s": 2.0}, step=4)
    lg.close()
    lg.close()  # idempotent
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert rows[0]["step"] == 3 and rows[0]["reward/mean"] == 0.25 and rows[0]["bad"] is None
    assert rows[1] == {"step": 4, "time": rows[1]["time"], "stall/total_s": 2.0}


def test_read_jsonl_skips_a_torn_last_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "x": 1}\n{"step": 2, "x"')
    assert read_jsonl(p) == [{"step": 1, "x": 1}]


def test_null_and_multi(tmp_path):
    seen = []

    class Spy:
        def log(self, metrics, step):
            seen.append((step, dict(metrics)))

        def log_rows(self, table, rows, step):
            seen.append((step, table, list(rows)))

        def close(self):
            seen.append("closed")

    assert isinstance(NullLogger(), MetricLogger) and isinstance(Spy(), MetricLogger)
    m = MultiLogger([NullLogger(), Spy()])
    assert len(m.loggers) == 1
    m.log({"a": 1}, step=0)
    m.log_rows("completions", [{"prompt": "p"}], step=0)
    m.close()
    assert seen == [(0, {"a": 1}), (0, "completions", [{"prompt": "p"}]), "closed"]


def test_make_logger_without_wandb_is_jsonl_only(tmp_path):
    lg = make_logger({"run_dir": str(tmp_path), "wandb": {"enabled": False}})
    assert [type(x) for x in lg.loggers] == [JsonlLogger]
    lg.log({"x": 1}, step=1)
    lg.close()
    assert read_jsonl(tmp_path / "metrics.jsonl")[0]["x"] == 1
    assert not (tmp_path / "wandb").exists()


def test_wandb_disabled_mode_means_no_wandb(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    lg = make_logger(LoggingConfig(run_dir=str(tmp_path)))
    assert [type(x) for x in lg.loggers] == [JsonlLogger]
    lg.close()


@pytest.mark.timeout(90)
def test_wandb_offline_run_writes_its_files(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline must be the default, not the env's
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = make_logger(LoggingConfig(run_dir=str(tmp_path), wandb=WandbLogger.Config(name="t")),
                     run_config={"recipe": "tiny"})
    wb = [x for x in lg.loggers if isinstance(x, WandbLogger)][0]
    assert wb.mode == "offline"
    for step in range(3):
        lg.log({"stall/total_s": 0.5 * step, "sync/gbps": 1.0, "reward/mean": 0.1 * step}, step=step)
    lg.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, os.listdir(tmp_path / "wandb")
    files = list(runs[0].glob("run-*.wandb"))
    assert files and files[0].stat().st_size > 0
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == 3
    spec = json.loads((tmp_path / "wandb_dashboard.json").read_text())
    assert spec[0]["name"] == "Stall"
    assert spec[0]["panels"][0]["keys"] == list(STALL_CAUSE_KEYS)


@pytest.mark.timeout(120)
def test_a_resumed_run_logs_to_the_same_wandb_run_and_a_fresh_one_does_not(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    ids = []
    for resume_step in (None, 0, None):
        lg = make_logger(LoggingConfig(run_dir=str(tmp_path)), resume_step=resume_step)
        ids.append([x for x in lg.loggers if isinstance(x, WandbLogger)][0].run.id)
        lg.close()
    assert ids[1] == ids[0] and ids[2] != ids[0], ids
    assert (tmp_path / WandbLogger.RUN_ID_FILE).read_text() == ids[2]


def test_dashboard_covers_the_issue_panels():
    titles = [p.title for s in STALL_DASHBOARD for p in s.panels]
    for want in ("Stall per step by cause", "Idle ratio", "Sync GB/s", "Workers per pool"):
        assert any(t.startswith(want) for t in titles), want


def test_apply_dashboard_builds_the_workspace_or_says_what_to_install():
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install wandb-workspaces"):
            apply_wandb_dashboard("me", "rlsync")
        return
    w = apply_wandb_dashboard("me", "rlsync", known_keys=["pool/spot/workers", "pool/main/workers"], save=False)
    pools = [p for s in w.sections for p in s.panels if p.title == "Workers per pool"][0]
    assert list(pools.y) == ["pool/main/workers", "pool/spot/workers"]
