"""StallClock and summarize: known sleeps in, known seconds out; clipping at window bounds."""

import pickle
import threading
import time

import pytest

from rlsync.core.stall import Event, Interval, State, StallClock, now_ns, summarize

S = 1_000_000_000


def iv(state, a, b, worker="w0", role="rollout", pool=None):
    return Interval(worker, role, pool, state, int(a * S), int(b * S))


def test_starts_idle_and_always_has_one_state():
    c = StallClock("w0", role="rollout")
    assert c.current is State.IDLE
    assert c.enter("generating") is State.IDLE
    assert c.current is State.GENERATING


def test_unknown_state_is_a_value_error_naming_valid_states():
    c = StallClock("w0", role="rollout")
    with pytest.raises(ValueError, match="waiting_weights"):
        c.enter("sleeping")
    with pytest.raises(ValueError):
        StallClock("w1", role="trainer", initial="nap")
    assert c.current is State.IDLE  # nothing changed


def test_state_context_nests_and_restores():
    c = StallClock("w0", role="rollout")
    c.enter("generating")
    with c.state("waiting_weights"):
        with c.state(State.LOADING_WEIGHTS):
            assert c.current is State.LOADING_WEIGHTS
        assert c.current is State.WAITING_WEIGHTS
    assert c.current is State.GENERATING
    states = [r.state for r in c.drain() if isinstance(r, Interval)]
    assert states == ["idle", "generating", "waiting_weights", "loading_weights", "waiting_weights", "generating"]


def test_state_context_restores_on_exception():
    c = StallClock("w0", role="trainer")
    c.enter("training")
    with pytest.raises(RuntimeError):
        with c.state("waiting_data"):
            raise RuntimeError("boom")
    assert c.current is State.TRAINING


def test_known_sleep_in_known_stall_out():
    c = StallClock("w0", role="rollout")
    t0 = now_ns()
    with c.state("waiting_weights"):
        time.sleep(0.2)
    with c.state("generating"):
        time.sleep(0.1)
    t1 = now_ns()
    secs = summarize(c.drain(), t0, t1)
    assert secs["waiting_weights"] == pytest.approx(0.2, abs=0.05)
    assert secs["generating"] == pytest.approx(0.1, abs=0.05)
    assert sum(secs.values()) == pytest.approx((t1 - t0) / S, abs=0.01)


def test_drain_cuts_the_open_interval_so_a_wait_spans_windows():
    c = StallClock("w0", role="rollout")
    c.enter("waiting_weights")
    t0 = now_ns()
    time.sleep(0.1)
    first = c.drain()
    t1 = now_ns()
    time.sleep(0.1)
    second = c.drain()
    t2 = now_ns()
    assert c.current is State.WAITING_WEIGHTS  # still waiting: the drain did not change state
    assert summarize(first, t0, t1)["waiting_weights"] == pytest.approx(0.1, abs=0.03)
    assert summarize(second, t1, t2)["waiting_weights"] == pytest.approx(0.1, abs=0.03)


def test_summarize_clips_to_the_window():
    recs = [iv("waiting_weights", 0.5, 2.5), iv("generating", 2.5, 4.0)]
    a = summarize(recs, 0, 1 * S)
    b = summarize(recs, 1 * S, 3 * S)
    assert a["waiting_weights"] == pytest.approx(0.5)
    assert b["waiting_weights"] == pytest.approx(1.5) and b["generating"] == pytest.approx(0.5)
    assert set(a) == {s.value for s in State}
    assert summarize(recs, 5 * S, 6 * S)["generating"] == 0.0
    with pytest.raises(ValueError):
        summarize(recs, 2 * S, 1 * S)


def test_events_and_records_pickle_as_plain_data():
    c = StallClock("rollout-3", role="rollout", pool="spot")
    c.event("fetch", version=3, bytes=1024, seconds=0.01)
    recs = c.drain()
    back = pickle.loads(pickle.dumps(recs))
    assert back == recs
    ev = [r for r in back if isinstance(r, Event)][0]
    assert (ev.name, ev.attrs["version"], ev.pool) == ("fetch", 3, "spot")


def test_buffer_is_bounded_and_counts_drops():
    c = StallClock("w0", role="rollout", max_records=10)
    for i in range(30):
        c.event("tick", i=i)
    recs = c.drain()
    assert len(recs) == 10 and c.dropped == 21  # 30 events + the cut interval, 10 kept
    assert recs[-1].state == "idle"


def test_one_writer_one_reader_lose_nothing():
    c = StallClock("w0", role="rollout")
    t0 = now_ns()
    got = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            got.extend(c.drain())

    th = threading.Thread(target=reader)
    th.start()
    for i in range(2000):
        c.enter("generating" if i % 2 else "waiting_weights")
    stop.set()
    th.join()
    got.extend(c.drain())
    t1 = now_ns()
    ivs = sorted((r for r in got if isinstance(r, Interval)), key=lambda r: r.start_ns)
    for a, b in zip(ivs, ivs[1:]):
        assert a.end_ns == b.start_ns  # contiguous: no gap, no overlap
    assert sum(summarize(got, t0, t1).values()) == pytest.approx((t1 - t0) / S, abs=1e-3)


def test_many_transitions_are_all_recorded_in_order():
    # Its cost is a benchmark (`python -m rlsync.bench stall_cost`), not a timed test.
    ticks = iter(range(1, 10**9))
    c = StallClock("w0", role="rollout", clock=lambda: next(ticks))
    n = 20_000
    for i in range(n):
        c.enter("generating" if i % 2 else "waiting_weights")
    recs = c.drain()
    assert c.dropped == 0
    # the initial idle interval, one per transition after the first, and the open one cut by drain()
    assert len(recs) == n + 1
    assert recs[0].state == "idle"
    assert [r.state for r in recs[1:]] == ["generating" if i % 2 else "waiting_weights" for i in range(n)]
    assert all(x.end_ns == y.start_ns for x, y in zip(recs, recs[1:]))  # contiguous: no gap, no overlap
