"""Staleness bound, sample buffer and request planning: pure logic, milliseconds."""
import pytest

from rlsync.driver.staleness import SampleBuffer, StalenessBound, plan_request


def test_bound_starts_requests_k_ahead_and_admits_up_to_the_cap():
    b = StalenessBound(2, cap=2)
    assert b.min_version(5) == 3 and b.min_version(1) == 0
    assert b.admits(3, 5) and not b.admits(2, 5)
    assert StalenessBound(0, cap=0).admits(5, 5) and not StalenessBound(0, cap=0).admits(4, 5)
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessBound(-1)


def test_cap_defaults_to_four_or_k_and_may_not_be_below_k():
    # rollout.max_off_policy_versions=None: an old config's max_staleness keeps how far ahead requests start,
    # and samples up to max(k, 4) versions old are trained (corrected) instead of dropped.
    assert StalenessBound(1).cap == 4 and StalenessBound(6).cap == 6
    assert StalenessBound(1).min_version(9) == 8
    assert StalenessBound(1).admits(5, 9) and not StalenessBound(1).admits(4, 9)
    with pytest.raises(ValueError, match="max_off_policy_versions=1 must be >= max_staleness=2"):
        StalenessBound(2, cap=1)


def test_the_cap_drops_only_groups_whose_oldest_token_is_older_than_it_and_counts_them():
    # A group is buffered under its oldest token's version (the driver passes Batch.versions.min()).
    buf = SampleBuffer()
    for v, name in [(5, "5 old: dropped"), (6, "4 old: kept"), (9, "fresh")]:
        buf.add(v, name, samples=8)
    took = buf.take(step=10, n=2, bound=StalenessBound(1, cap=4))
    assert took.payloads == ["4 old: kept", "fresh"] and (took.dropped_groups, took.dropped_samples) == (1, 8)
    assert took.metrics(10) == {"staleness/dropped": 8.0, "staleness/generated": 24.0,
                                "staleness/mean": 2.5, "staleness/max": 4.0}
    assert buf.take(step=10, n=1, bound=StalenessBound(1)).metrics(10) == {"staleness/dropped": 0.0,
                                                                          "staleness/generated": 0.0}
    assert (buf.generated_samples, buf.dropped_samples) == (24, 8)


def test_take_drops_and_counts_stale_groups_then_pops_fresh_fifo():
    buf = SampleBuffer()
    for v, name in [(1, "a"), (3, "b"), (2, "c"), (4, "d")]:
        buf.add(v, name, samples=8)
    took = buf.take(step=4, n=2, bound=StalenessBound(1, cap=1))   # admits versions 3, 4
    assert took.payloads == ["b", "d"] and took.versions == [3, 4]
    assert (took.dropped_groups, took.dropped_samples) == (2, 16)
    assert len(buf) == 0 and buf.dropped_samples == 16


def test_take_without_enough_fresh_takes_nothing_but_still_drops():
    buf = SampleBuffer()
    buf.add(0, "old", samples=4)
    buf.add(2, "new", samples=4)
    took = buf.take(step=2, n=2, bound=StalenessBound(0, cap=0))
    assert took.payloads == [] and took.dropped_samples == 4
    assert len(buf) == 1 and buf.fresh(2, StalenessBound(0, cap=0)) == 1
    assert buf.take(step=3, n=1, bound=StalenessBound(0, cap=0)).dropped_samples == 4  # now stale too


def test_on_policy_plan_waits_for_the_version_being_trained():
    k0 = StalenessBound(0)
    kw = dict(groups_per_step=4, bound=k0, total_steps=10)
    # Trainer idle at step 3, nothing buffered: a request feeds step 3 (version 3 exists).
    assert plan_request(steps_done=3, training=False, buffered=0, inflight=0, **kw) == 3
    # Step 3 training: the next request feeds step 4, whose version is being made: allowed (it waits).
    assert plan_request(steps_done=3, training=True, buffered=0, inflight=0, **kw) == 4
    # Step 4 already covered by requests in flight: step 5 would need version 5, not made yet.
    assert plan_request(steps_done=3, training=True, buffered=0, inflight=4, **kw) is None
    assert plan_request(steps_done=3, training=True, buffered=2, inflight=1, **kw) == 4


def test_async_plan_runs_at_most_k_versions_ahead_and_stops_at_the_end():
    kw = dict(groups_per_step=4, bound=StalenessBound(2), total_steps=10)
    assert plan_request(steps_done=3, training=True, buffered=4, inflight=4, **kw) == 6
    assert plan_request(steps_done=3, training=True, buffered=8, inflight=4, **kw) is None   # step 7 needs v5
    assert plan_request(steps_done=9, training=True, buffered=0, inflight=0, **kw) is None   # past the end
