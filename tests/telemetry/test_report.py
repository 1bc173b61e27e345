"""python -m rlsync.report on a synthetic run: PNGs and one HTML page embedding them."""

import subprocess
import sys

import pytest

from rlsync.telemetry.loggers import read_jsonl
from rlsync.report import build_report

PNGS = ["stall_by_cause.png", "idle_ratio.png", "reward.png", "sync.png", "timeline.png"]


def test_synthetic_run_has_the_injected_stall(synthetic_run):
    rows = read_jsonl(synthetic_run / "metrics.jsonl")
    assert len(rows) == 8
    for r in rows:
        assert r["stall/rollout_wait_weights_s"] == pytest.approx(0.5)
        assert r["stall/rollout_load_weights_s"] == pytest.approx(0.1)
        assert r["stall/trainer_wait_data_s"] == pytest.approx(0.3)
        assert r["stall/trainer_wait_release_s"] == pytest.approx(0.2)
        assert r["stall/rollout_idle_ratio"] == pytest.approx((0.5 + 0.5 + 0.1 + 0.5) / 4.0)
        assert r["sync/gbps"] == pytest.approx(0.5)  # 200 MB in 0.4 s


def test_report_module_writes_pngs_and_html(synthetic_run):
    out = subprocess.run([sys.executable, "-m", "rlsync.report", str(synthetic_run)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    index = synthetic_run / "report" / "index.html"
    assert out.stdout.strip() == str(index)
    html = index.read_text()
    for name in PNGS:
        png = synthetic_run / "report" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert html.count("data:image/png;base64,") == len(PNGS)
    assert "no data" not in html


def test_report_skips_missing_parts_and_fails_clearly_on_an_empty_dir(tmp_path, synthetic_run):
    (synthetic_run / "trace.json").unlink()
    html = build_report(synthetic_run).read_text()
    assert "no data for this plot" in html  # the timeline
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        build_report(empty)
