"""The CI chaos run: ≥ 30 kills including ≥ 2 hub kills against real processes; nothing torn, nothing lost."""
import pytest

from rlsync.bench.chaos import run_chaos


@pytest.mark.timeout(300)
def test_chaos_schedule_nothing_torn_nothing_lost():
    res = run_chaos(kills=30, hub_kills=2, seed=1, readers=3, size_mb=1.0, interval_s=1.0, max_seconds=150)
    assert res["kills"] >= 30 and res["hub_kills"] >= 2, res
    assert res["torn"] == 0, res
    assert res["lost"] == 0, res
    assert res["fetches_failed_untyped"] == 0, res["errors"]
    assert res["fetches_ok"] > 30, res
    assert res["publishes"] > 10 and res["publish_errors"] == 0, res["errors"]
    # every fetch finished (or failed typed) within its deadlines: io 3 s × replans, hub 20 s
    assert res["fetch_seconds_max"] < 60, res
