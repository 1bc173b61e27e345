import pytest

from rlsync.telemetry.loggers import JsonlLogger
from rlsync.telemetry.metrics import StepAggregator
from rlsync.core.stall import StallClock
from rlsync.telemetry.trace import TraceWriter

S = 1_000_000_000


@pytest.fixture
def synthetic_run(tmp_path):
    """A run dir made by the real recording path on a synthetic timeline (no sleeps): 2 rollouts of
    which one waits 0.5 s for weights every step, 1 trainer starved of data for 0.3 s per step."""
    t = [0]

    def at(seconds):  # move the fake clock every StallClock here reads
        t[0] = int(seconds * S)

    def fake() -> int:
        return t[0]

    clocks = [StallClock("r0", "rollout", "main", clock=fake), StallClock("r1", "rollout", "spot", clock=fake),
              StallClock("t0", "trainer", clock=fake)]
    agg = StepAggregator(start_ns=0)
    jl = JsonlLogger(tmp_path)
    with TraceWriter(tmp_path / "trace.json", t0_ns=0) as tw:
        for step in range(1, 9):
            base = (step - 1) * 2.0
            r0, r1, tr = clocks
            at(base); r0.enter("waiting_weights"); r1.enter("loading_weights"); tr.enter("waiting_data")
            at(base + 0.1); r1.enter("generating")
            at(base + 0.3); tr.enter("training")
            at(base + 0.5); r0.event("fetch", version=step, bytes=200_000_000, seconds=0.4)
            r0.enter("generating")
            at(base + 1.5); r0.enter("idle"); r1.enter("idle")
            at(base + 1.8); tr.event("publish", version=step, bytes=200_000_000); tr.enter("releasing")
            at(base + 2.0)
            recs = [x for c in clocks for x in c.drain()]
            agg.add(recs)
            tw.add(recs)
            m = agg.close_step(int((base + 2.0) * S)).to_dict()
            m["reward/mean"] = 0.1 * step
            tw.step(step, int(base * S), int((base + 2.0) * S), version=step)
            jl.log(m, step=step)
    jl.close()
    return tmp_path
