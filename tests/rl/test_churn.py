"""Pool policies and the source ledger: pure logic, milliseconds."""
import pytest

from rlsync.pool.churn import JOIN, PREEMPT_KILL, PREEMPT_NOTICE, AutoscaleConfig, ChurnConfig, ChurnSchedule, autoscale_delta
from rlsync.telemetry.sync_sources import Place, SourceLedger
from rlsync.core.events import FetchEvent
from rlsync.core.stall import Event

MB = 1_000_000


def test_churn_schedule_is_seeded_counted_and_inside_its_steps():
    cfg = ChurnConfig(seed=7, preemptions=6, notice_fraction=0.5, joins=4, first_step=10, last_step=100)
    a, b = ChurnSchedule.build(cfg, "spot", 200), ChurnSchedule.build(cfg, "spot", 200)
    assert a.events == b.events                                      # same seed, same schedule
    kinds = [e.kind for e in a.events]
    assert kinds.count(PREEMPT_NOTICE) == 3 and kinds.count(PREEMPT_KILL) == 3 and kinds.count(JOIN) == 4
    assert all(10 <= e.step <= 100 for e in a.events)
    assert [e.step for e in a.events] == sorted(e.step for e in a.events)
    assert ChurnSchedule.build(cfg, "other", 200).events != a.events  # pools churn independently
    assert sum(len(a.at(s)) for s in range(201)) == 10
    assert a.pick_victim(["spot-2", "spot-0"]) in {"spot-0", "spot-2"} and a.pick_victim([]) is None


def test_churn_schedule_never_lands_after_the_last_step_and_rejects_bad_input():
    s = ChurnSchedule.build(ChurnConfig(preemptions=5, joins=5, first_step=1), "p", total_steps=8)
    assert all(1 <= e.step <= 7 for e in s.events)
    with pytest.raises(ValueError, match="notice_fraction"):
        ChurnSchedule.build(ChurnConfig(preemptions=1, notice_fraction=2.0), "p", 10)
    with pytest.raises(ValueError, match="no step"):
        ChurnSchedule.build(ChurnConfig(joins=1, first_step=50, last_step=60), "p", 10)


def test_autoscale_grows_on_trainer_starvation_and_shrinks_on_idle_within_bounds():
    a = AutoscaleConfig(grow_above_wait_ratio=0.3, shrink_above_idle_ratio=0.7)
    kw = dict(min_size=1, max_size=3)
    assert autoscale_delta(a, size=2, trainer_wait_data_ratio=0.5, rollout_idle_ratio=0.1, **kw) == 1
    assert autoscale_delta(a, size=3, trainer_wait_data_ratio=0.5, rollout_idle_ratio=0.1, **kw) == 0
    assert autoscale_delta(a, size=2, trainer_wait_data_ratio=0.0, rollout_idle_ratio=0.9, **kw) == -1
    assert autoscale_delta(a, size=1, trainer_wait_data_ratio=0.0, rollout_idle_ratio=0.9, **kw) == 0
    assert autoscale_delta(a, size=0, trainer_wait_data_ratio=None, rollout_idle_ratio=None, **kw) == 1
    assert autoscale_delta(a, size=2, trainer_wait_data_ratio=None, rollout_idle_ratio=None, **kw) == 0


def _fetch(worker, ts, by_source, dc="dc1", version=1, **kw):
    ev = FetchEvent(version=version, bytes=10 * MB, seconds=0.1, bytes_by_source=by_source, dc=dc, **kw)
    return Event(worker, "rollout", "far", FetchEvent.NAME, ts, ev.attrs())


def test_ledger_splits_sources_and_counts_one_cross_dc_copy_per_version():
    led = SourceLedger(trainer_dc="dc0")
    led.places.update({"w2": Place("peer", "dc1", "far"), "w3": Place("peer", "dc1", "far"),
                       "w9": Place("seed", "dc1")})
    recs = [_fetch("seed-dc1", 10, {"w1": 10 * MB}, version=1),              # crosses: the trainer is in dc0
            _fetch("far-0", 20, {"w9": 10 * MB}, version=1),                 # from the seed in dc1
            _fetch("far-1", 30, {"w2": 6 * MB, "w9": 4 * MB}, version=1, join=True),
            _fetch("far-0", 40, {"w1": 10 * MB}, version=2),
            _fetch("far-1", 150, {"w1": 10 * MB}, version=2)]                # after the window: next one
    m = led.window(recs, 0, 100)
    assert m["sync/sources_trainer"] == 20 * MB and m["sync/sources_seed"] == 14 * MB
    assert m["sync/sources_peer"] == 6 * MB and m["sync/sources_used"] == 3
    assert m["sync/cross_dc_bytes"] == 20 * MB and m["sync/cross_dc_copies"] == 2.0
    assert m["sync/join_fetches"] == 1 and m["sync/join_fetches_from_trainer"] == 0
    assert led.totals()["sync/cross_dc_copies_per_version"] == 1.0
    m2 = led.window([], 100, 200)                                            # the carried-over fetch
    assert m2["sync/cross_dc_bytes"] == 10 * MB
    t = led.totals()
    assert t["sync/cross_dc_versions"] == 2 and t["sync/cross_dc_copies_per_version"] == 1.5
    assert t["sync/cross_dc_bytes"] == 30 * MB
