"""StepMetrics on synthetic intervals: each key's formula, and the stalled runs anchors got wrong."""

import time

import pytest

from rlsync.telemetry.metrics import STALL_CAUSE_KEYS, HubStats, StepAggregator, StepMetrics, SyncStats
from rlsync.core.stall import Event, Interval, StallClock, now_ns

S = 1_000_000_000


def iv(worker, role, state, a, b, pool=None):
    return Interval(worker, role, pool, state, int(a * S), int(b * S))


def fetch(worker, ts, nbytes, seconds, pool=None):
    return Event(worker, "rollout", pool, "fetch", int(ts * S), {"bytes": nbytes, "seconds": seconds, "version": 1})


def test_rollout_wait_weights_is_summed_over_rollout_workers():
    # Window [0, 2): two rollouts each wait 0.5 s for weights, then generate.
    recs = [
        iv("r0", "rollout", "waiting_weights", 0, 0.5), iv("r0", "rollout", "generating", 0.5, 2),
        iv("r1", "rollout", "waiting_weights", 0, 0.5), iv("r1", "rollout", "generating", 0.5, 2),
        iv("t0", "trainer", "training", 0, 2),
    ]
    m = StepMetrics.compute(recs, 0, 2 * S).to_dict()
    assert m["stall/rollout_wait_weights_s"] == pytest.approx(1.0)
    assert m["stall/rollout_idle_ratio"] == pytest.approx(0.25)  # 1.0 of 4.0 worker-s
    assert m["stall/trainer_idle_ratio"] == pytest.approx(0.0)
    assert m["stall/total_s"] == pytest.approx(1.0)
    assert m["stall/window_s"] == pytest.approx(2.0)


def test_trainer_starved_of_data_and_waiting_on_release():
    recs = [
        iv("t0", "trainer", "waiting_data", 0, 1.2), iv("t0", "trainer", "training", 1.2, 1.8),
        iv("t0", "trainer", "releasing", 1.8, 1.9), iv("t0", "trainer", "offloading", 1.9, 2.0),
        iv("r0", "rollout", "generating", 0, 2),
    ]
    m = StepMetrics.compute(recs, 0, 2 * S).to_dict()
    assert m["stall/trainer_wait_data_s"] == pytest.approx(1.2)
    assert m["stall/trainer_wait_release_s"] == pytest.approx(0.1)
    assert m["stall/trainer_offload_s"] == pytest.approx(0.1)
    assert m["stall/trainer_idle_ratio"] == pytest.approx(0.7)
    assert m["stall/total_s"] == pytest.approx(1.4)


def test_training_bound_run_reads_high_rollout_idle_not_zero():
    # verl#6693: rollouts finish fast and sit idle while the trainer trains; idle must read ~0.8.
    recs = []
    for w in ("r0", "r1", "r2"):
        recs += [iv(w, "rollout", "generating", 0, 1), iv(w, "rollout", "idle", 1, 5)]
    recs += [iv("t0", "trainer", "waiting_data", 0, 1), iv("t0", "trainer", "training", 1, 5)]
    m = StepMetrics.compute(recs, 0, 5 * S).to_dict()
    assert m["stall/rollout_idle_ratio"] == pytest.approx(0.8)
    assert m["stall/rollout_idle_s"] == pytest.approx(12.0)
    assert m["stall/trainer_idle_ratio"] == pytest.approx(0.2)
    assert m["stall/total_s"] == pytest.approx(13.0)


def test_all_cause_keys_present_and_stack_to_total():
    m = StepMetrics.compute([iv("r0", "rollout", "generating", 0, 1)], 0, 1 * S).to_dict()
    assert all(m[k] == 0 for k in STALL_CAUSE_KEYS)
    assert m["stall/total_s"] == 0
    assert "stall/trainer_idle_ratio" not in m  # no trainer observed: absent, not a fake 0


def test_wait_through_a_window_boundary_counts_in_both_windows():
    # A rollout waits for weights from 1.5 s to 3.5 s; steps end at 2 s and 4 s.
    agg = StepAggregator(start_ns=0)
    agg.add([iv("r0", "rollout", "generating", 0, 1.5), iv("r0", "rollout", "waiting_weights", 1.5, 3.5),
             iv("r0", "rollout", "generating", 3.5, 4)])
    m1 = agg.close_step(2 * S).to_dict()
    m2 = agg.close_step(4 * S).to_dict()
    assert m1["stall/rollout_wait_weights_s"] == pytest.approx(0.5)
    assert m2["stall/rollout_wait_weights_s"] == pytest.approx(1.5)
    m3 = agg.close_step(5 * S).to_dict()  # nothing left: pruned
    assert m3["stall/rollout_wait_weights_s"] == 0


def test_aggregator_with_real_clocks_and_sleeps():
    r = StallClock("r0", role="rollout", pool="main")
    t = StallClock("t0", role="trainer")
    agg = StepAggregator()
    for _ in range(2):
        with r.state("waiting_weights"), t.state("training"):
            time.sleep(0.15)
        with r.state("generating"), t.state("waiting_data"):
            time.sleep(0.05)
        agg.add(r.drain() + t.drain())
        m = agg.close_step().to_dict()
        assert m["stall/rollout_wait_weights_s"] == pytest.approx(0.15, abs=0.05)
        assert m["stall/trainer_wait_data_s"] == pytest.approx(0.05, abs=0.04)
        assert m["stall/rollout_idle_ratio"] > 0.5


def test_sync_from_fetch_events_is_union_of_spans():
    # Two concurrent 1 GB fetches over [0.5, 1.5) and [1.0, 2.0): 2 GB in 1.5 s of wall time.
    recs = [fetch("r0", 1.5, 10**9, 1.0), fetch("r1", 2.0, 10**9, 1.0), fetch("r2", 9.0, 10**9, 1.0)]
    s = SyncStats.from_events(recs, 0, 3 * S)
    assert (s.bytes, s.fetches) == (2 * 10**9, 2)
    assert s.seconds == pytest.approx(1.5)
    assert s.gbps == pytest.approx(2 / 1.5)
    m = StepMetrics.compute(recs, 0, 3 * S).to_dict()
    assert m["sync/gbps"] == pytest.approx(2 / 1.5) and m["sync/bytes"] == 2 * 10**9
    assert SyncStats().gbps == 0.0


def test_engine_updates_sum_fetch_apply_pause_in_the_window():
    # engines that stage and apply (vLLM) record one engine_update per version
    up = lambda ts, f, a, p: Event("r0", "rollout", "main", "engine_update", int(ts * S),  # noqa: E731
                                   {"version": 1, "fetch_s": f, "apply_s": a, "pause_s": p})
    recs = [up(0.5, 0.2, 0.3, 0.35), up(1.5, 0.1, 0.4, 0.45), up(5.0, 9.0, 9.0, 9.0)]
    m = StepMetrics.compute(recs, 0, 2 * S).to_dict()
    assert m["sync/fetch_s"] == pytest.approx(0.3) and m["sync/apply_s"] == pytest.approx(0.7)
    assert m["sync/pause_s"] == pytest.approx(0.8) and m["sync/engine_updates"] == 2
    assert "sync/pause_s" not in StepMetrics.compute([], 0, S).to_dict()  # hf engines: no such keys
    assert "sync/decode_pause_s" not in m  # only engines that switch versions mid-generation report it
    inflight = [Event("r0", "rollout", "main", "engine_update", int(0.5 * S), {"version": 2, "fetch_s": 0.2,
                      "apply_s": 0.3, "pause_s": 0.0, "fetch_wait_s": 0.0, "decode_pause_s": 0.004,
                                                                                       "stage_raised": 1.0})] * 2
    m = StepMetrics.compute(inflight, 0, S).to_dict()
    assert m["sync/decode_pause_s"] == pytest.approx(0.008) and m["sync/stage_raised"] == 2
    assert "sync/stage_raised" not in StepMetrics.compute(recs, 0, 2 * S).to_dict()  # only in-flight engines


def test_explicit_sync_and_hub_stats():
    m = StepMetrics.compute([], 0, S, sync=SyncStats(bytes=4 * 10**9, seconds=2.0),
                            hub=HubStats(replicas=5, retained_versions=2)).to_dict()
    assert m["sync/gbps"] == pytest.approx(2.0)
    assert (m["hub/replicas"], m["hub/retained_versions"]) == (5, 2)
    assert "hub/plan_ms" not in m  # a hub that does not report its latency: no such keys
    m = StepMetrics.compute([], 0, S, hub=HubStats(replicas=5, retained_versions=2, plan_ms=0.2, plan_ms_p99=0.9,
                                                   rpc_per_s=1200.0, heartbeat_lag_ms=850.0)).to_dict()
    assert (m["hub/plan_ms"], m["hub/plan_ms_p99"], m["hub/rpc_per_s"], m["hub/heartbeat_lag_ms"]) == \
        (0.2, 0.9, 1200.0, 850.0)


def test_pool_keys_count_workers_and_idle():
    recs = [
        iv("a0", "rollout", "generating", 0, 1, pool="main"),
        iv("s0", "rollout", "waiting_weights", 0, 1, pool="spot"),
        iv("s1", "rollout", "generating", 0, 0.5, pool="spot"),  # joined... left halfway
        iv("t0", "trainer", "training", 0, 1),
    ]
    m = StepMetrics.compute(recs, 0, S).to_dict()
    assert (m["pool/main/workers"], m["pool/spot/workers"], m["pool/trainer/workers"]) == (1, 2, 1)
    assert m["pool/spot/idle_ratio"] == pytest.approx(1.0 / 1.5)  # observed time, not |W| x workers
    assert m["pool/main/idle_ratio"] == 0.0
