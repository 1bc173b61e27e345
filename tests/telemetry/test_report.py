"""python -m rlsync.report on a synthetic run: PNGs and one HTML page embedding them."""

import subprocess
import sys

import pytest

from rlsync.telemetry.loggers import read_jsonl
from rlsync.telemetry.report import build_report

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


def test_the_stall_chart_bins_long_runs_counting_every_step_and_says_how_to_read_each_chart(tmp_path):
    from rlsync.telemetry.report import MAX_BARS, stall_bins

    key = "stall/rollout_wait_weights_s"
    rows = [{"step": s, key: float(s)} for s in range(1, 376)]          # 375 steps: too many for one bar each
    size, starts, means = stall_bins(rows, [key])
    assert size == 4 and len(starts) <= MAX_BARS and starts[0] == 1 and starts[-1] == 373
    assert means[key][0] == (1 + 2 + 3 + 4) / 4                         # a mean per step over the bin
    assert means[key][-1] == (373 + 374 + 375) / 3                       # the last partial bin kept, not dropped
    assert sum(m * min(size, 376 - s) for m, s in zip(means[key], starts)) == sum(range(1, 376))
    assert stall_bins(rows[:50], [key])[0] == 1                          # short runs: a bar per step
    (tmp_path / "metrics.jsonl").write_text("\n".join(__import__("json").dumps(r) for r in rows))
    page = build_report(tmp_path).read_text()
    assert page.count("How to read:") >= 2                               # one sentence per chart with data
    from rlsync.telemetry.report import CAUSE_NAMES
    from rlsync.telemetry.metrics import CAUSES

    assert set(CAUSE_NAMES) == set(CAUSES.values())                      # every cause has a name in words
    assert CAUSE_NAMES["wait_weights"] == "waiting for the next version"
