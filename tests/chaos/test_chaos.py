"""The CI chaos sweep: several seeded kill schedules (hub kills included) against real processes;
nothing torn, nothing lost, nothing untyped, on every seed."""
import pytest

from rlsync.bench.chaos import run_chaos, total

SEEDS = [1, 2, 3]  # the suite's time budget (< 15 min); the full sweep: python -m rlsync.bench chaos --seeds 10


@pytest.mark.timeout(900)
def test_chaos_sweep_nothing_torn_lost_or_untyped():
    results = [run_chaos(kills=10, hub_kills=4, seed=s, readers=3, size_mb=1.0, interval_s=0.4, max_seconds=600,
                         settle_s=0.5) for s in SEEDS]
    tot = total(results)
    for r in results:
        assert r["kills"] >= 10 and r["hub_kills"] >= 4, r
        assert r["torn"] == 0, r
        assert r["lost"] == 0, (r["seed"], r["error_samples"])
        assert r["fetches_failed_untyped"] == 0, (r["seed"], r["error_samples"])
        assert r["fetches_ok"] > 5, r
        assert r["publishes"] > 3 and r["publish_errors"] == 0, (r["seed"], r["errors"])
        # every hub restart ended with a successful fetch of latest by the probe reader
        assert len(r["failover_fetch_seconds"]) == r["hub_kills"], (r["seed"], r["error_samples"])
        # every fetch finished (or failed typed) within its deadlines: io 3 s × replans, hub 20 s
        assert r["fetch_seconds_max"] < 60, r
    assert tot["kills"] >= 30 and tot["hub_kills"] >= 12, tot
