"""Chrome trace: valid JSON, a process per role/pool, a track per worker, slices and instants."""

import json

import pytest

from rlsync.core.stall import Event, Interval, StallClock
from rlsync.telemetry.trace import TraceWriter, load_trace

S = 1_000_000_000


def iv(worker, role, pool, state, a, b):
    return Interval(worker, role, pool, state, int(a * S), int(b * S))


def _by_ph(trace, ph):
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_structure(tmp_path):
    path = tmp_path / "trace.json"
    with TraceWriter(path, t0_ns=0) as tw:
        tw.add([
            iv("r0", "rollout", "spot", "waiting_weights", 0, 0.5),
            iv("r0", "rollout", "spot", "generating", 0.5, 2),
            iv("r1", "rollout", "spot", "generating", 0, 2),
            iv("t0", "trainer", None, "training", 0, 1.5),
            Event("t0", "trainer", None, "publish", int(1.5 * S), {"version": 3, "bytes": 100}),
            Event("r0", "rollout", "spot", "fetch", int(0.5 * S), {"version": 3, "bytes": 100}),
        ])
        tw.step(1, 0, 2 * S, version=3)
    trace = json.loads(path.read_text())  # strict JSON, whole file
    assert trace["otherData"]["t0_ns"] == 0
    procs = {e["args"]["name"]: e["pid"] for e in _by_ph(trace, "M") if e["name"] == "process_name"}
    assert set(procs) == {"driver", "rollout/spot", "trainer"}
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in _by_ph(trace, "M") if e["name"] == "thread_name"}
    assert threads["r0"][0] == threads["r1"][0] == procs["rollout/spot"]
    assert threads["r0"] != threads["r1"]  # one track per worker
    assert threads["t0"][0] == procs["trainer"]
    slices = [e for e in _by_ph(trace, "X") if e["cat"] == "state"]
    ww = [e for e in slices if e["name"] == "waiting_weights"][0]
    assert (ww["ts"], ww["dur"]) == (0.0, 500_000.0)  # microseconds
    assert (ww["pid"], ww["tid"]) == threads["r0"]
    assert len(slices) == 4
    instants = {e["name"]: e for e in _by_ph(trace, "i")}
    assert instants["publish"]["args"] == {"version": 3, "bytes": 100}
    assert instants["publish"]["ts"] == 1.5e6 and instants["publish"]["s"] == "t"
    step = [e for e in _by_ph(trace, "X") if e["cat"] == "step"][0]
    assert step["name"] == "step 1" and step["dur"] == 2e6 and step["args"]["version"] == 3


def test_drain_cuts_are_merged_into_one_slice(tmp_path):
    path = tmp_path / "trace.json"
    c = StallClock("r0", role="rollout")
    c.enter("waiting_weights")
    with TraceWriter(path) as tw:
        for _ in range(3):
            tw.add(c.drain())  # each drain cuts the open wait
    slices = [e for e in _by_ph(load_trace(path), "X") if e["cat"] == "state"]
    assert [e["name"] for e in slices] == ["idle", "waiting_weights"]
    assert all(e["dur"] >= 0 for e in slices)


def test_a_crashed_trace_still_loads(tmp_path):
    path = tmp_path / "trace.json"
    tw = TraceWriter(path, t0_ns=0)
    tw.add([iv("r0", "rollout", None, "generating", 0, 1), iv("r0", "rollout", None, "idle", 1, 2),
            iv("r0", "rollout", None, "generating", 2, 3)])
    tw.flush()  # no close(): the process died
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    trace = load_trace(path)
    assert [e["name"] for e in _by_ph(trace, "X")] == ["generating", "idle"]  # the open last one is lost
    path.write_text(path.read_text() + ',\n{"ph": "X", "na')  # torn mid-event
    assert len(_by_ph(load_trace(path), "X")) == 2
