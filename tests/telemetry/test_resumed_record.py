"""A resumed run continues the record (issue 36 item 4): metrics rows after the checkpoint's step replaced, not
appended twice; the trace appended (also after a crash cut it mid-event), never overwritten; the summary says
which parts were resumed and what each took. Pure files, milliseconds. The whole path (Ctrl-C, then
`resume=auto`) is tests/rl/test_resume_after_interrupt.py."""
import json

from rlsync.core.stall import Event, Interval
from rlsync.telemetry.loggers import JsonlLogger, LoggingConfig, read_jsonl
from rlsync.telemetry.record import RunRecord, read_parts
from rlsync.telemetry.summary import run_summary, summarize_run
from rlsync.telemetry.trace import TraceWriter, load_trace

S = 1_000_000_000


def test_resumed_metrics_keep_steps_through_the_checkpoint_and_each_step_once(tmp_path):
    lg = JsonlLogger(tmp_path)
    for s in range(1, 10):  # steps 1..9 logged, the checkpoint is at 6: 7..9 are trained again
        lg.log({"reward/mean": s / 10}, step=s)
    lg.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 10, "rew')  # and a crash tore the last line
    lg = JsonlLogger(tmp_path, keep_through_step=6)
    lg.log({"eval/accuracy": 0.5}, step=6)  # the resumed part's start-up eval of step 6: the earlier part's
    for s in range(7, 11):
        lg.log({"reward/mean": 1.0}, step=s)
    lg.close()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert [r["reward/mean"] for r in rows[:6]] == [s / 10 for s in range(1, 7)] and rows[6]["reward/mean"] == 1.0
    assert not list(tmp_path.glob("*.tmp"))


def _iv(worker, pool, state, a, b):
    return Interval(worker, "rollout", pool, state, int(a * S), int(b * S))


def test_a_resumed_trace_is_appended_with_its_tracks_and_a_mark(tmp_path):
    path = tmp_path / "trace.json"
    with TraceWriter(path, t0_ns=0) as tw:
        tw.add([_iv("r0", "main", "generating", 0, 1), _iv("a0", "spot2", "generating", 0, 1)])  # a0: attached
        tw.step(1, 0, 1 * S)
    first = load_trace(path)
    with TraceWriter(path, resumed_from_step=1) as tw:
        assert tw.t0_ns == 0
        tw.add([_iv("r0", "main", "generating", 5, 6), _iv("r9", "new", "generating", 5, 6)])
        tw.step(2, 5 * S, 6 * S)
    trace = json.loads(path.read_text())  # strict JSON: one file, both parts
    assert trace["traceEvents"][:len(first["traceEvents"])] == first["traceEvents"]  # the first part untouched
    steps = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert steps == ["step 1", "step 2"]
    assert any(e["name"] == "resumed from step 1" for e in trace["traceEvents"])
    threads = [(e["args"]["name"], e["pid"], e["tid"]) for e in trace["traceEvents"] if e.get("name") == "thread_name"]
    assert [t[0] for t in threads] == ["steps", "r0", "a0", "r9"]  # r0 keeps its track; a0's is still there
    assert len({t[1:] for t in threads}) == 4
    r0 = [e for e in trace["traceEvents"] if e.get("ph") == "X" and (e["pid"], e["tid"]) == threads[1][1:]]
    assert [e["ts"] for e in r0] == [0.0, 5e6]  # one timeline: the second part after the gap


def test_a_trace_cut_by_a_crash_is_continued_from_its_last_whole_event(tmp_path):
    path = tmp_path / "trace.json"
    tw = TraceWriter(path, t0_ns=0)
    tw.add([Event("r0", "rollout", None, "fetch", 1 * S, {"bytes": 1}),
            Event("r0", "rollout", None, "fetch", 2 * S, {})])
    tw.flush()  # the process died: no closing brackets
    path.write_text(path.read_text() + ',\n{"ph": "i", "na')  # torn mid-event
    with TraceWriter(path, resumed_from_step=3) as tw2:
        tw2.add([Event("r0", "rollout", None, "fetch", 9 * S, {})])
    fetches = [e["ts"] for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "fetch"]
    assert fetches == [1e6, 2e6, 9e6]


def test_the_summary_names_the_resumed_parts_and_their_wall_times(tmp_path):
    cfg = LoggingConfig(run_dir=str(tmp_path))
    cfg.wandb.enabled = False
    rec = RunRecord(tmp_path, cfg, {}, resumed_from_step=None)
    for s in (1, 2, 3):
        rec.logger.log({"reward/mean": 0.1 * s}, step=s)
    rec.close(last_step=3)
    rec = RunRecord(tmp_path, cfg, {}, resumed_from_step=3)
    for s in (4, 5):
        rec.logger.log({"reward/mean": 0.5}, step=s)
    rec.close(last_step=5)
    parts = read_parts(tmp_path)
    assert [(p["part"], p["resumed_from_step"], p["first_step"], p["last_step"]) for p in parts] == [
        (1, None, 1, 3), (2, 3, 4, 5)]
    assert all(p["wall_s"] is not None for p in parts)
    sections = summarize_run(tmp_path, {}, wall_s=999.0)
    learning, time_ = dict(sections["learning"]), dict(sections["time"])
    assert learning["steps"] == "5" and learning["resumed from step"] == "3"
    assert "part 1: steps 1-3" in time_ and "part 2: steps 4-5, resumed from step 3" in time_
    assert "wall time, all parts" in time_ and "wall time" not in time_  # not this process's clock alone
    # a fresh run in the same directory starts the parts over
    RunRecord(tmp_path, cfg, {}, resumed_from_step=None).close(last_step=0)
    assert len(read_parts(tmp_path)) == 1
    assert "resumed from step" not in dict(run_summary([], parts=read_parts(tmp_path))["learning"])
