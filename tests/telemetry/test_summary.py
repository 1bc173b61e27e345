import io

from rich.console import Console

from rlsync.telemetry.metrics import STALL_CAUSE_KEYS
from rlsync.telemetry.summary import STALL_NAMES, print_run_summary, run_summary


def _rows(n=20):
    rows = []
    for s in range(1, n + 1):
        r = {k: 0.0 for k in STALL_CAUSE_KEYS}
        r.update({"step": s, "version": s, "reward/mean": s / n, "sync/bytes": 1e6,
                  "stall/rollout_wait_weights_s": 0.3, "stall/rollout_load_weights_s": 0.1,
                  "events/preemptions": 0.0, "events/preemptions_kill": 0.0, "events/joined": 0.0,
                  "events/attached": 0.0})
        rows.append(r)
    rows[4].update({"events/preemptions": 1.0, "events/preemptions_kill": 1.0})
    rows[6]["events/joined"] = 2.0
    rows[7]["events/attached"] = 1.0
    rows[9]["events/shrinks"] = 1.0  # a counter this module has no name for still shows
    return rows


def test_sections_carry_reward_stall_by_cause_and_the_events_that_happened():
    s = run_summary(_rows(), totals={"pool/failed_requests": 2, "pool/lost_prompts": 0, "sync/bytes": 20e6},
                    wall_s=312.0, status="done")
    learning = dict(s["learning"])
    assert learning["steps"] == "20" and learning["versions published"].startswith("20")
    # first 10 steps: 0.05..0.5 (mean 0.275); last 10: 0.55..1.0 (mean 0.775)
    assert learning["reward, mean of first / last 10 steps"] == "0.275 -> 0.775"
    assert learning["reward, first / last step"] == "0.050 -> 1.000"
    stall = s["stall (worker-seconds over the run)"]
    assert stall[0] == (STALL_NAMES["stall/rollout_wait_weights_s"], "6.0 s (75%)")  # largest first
    assert stall[1] == (STALL_NAMES["stall/rollout_load_weights_s"], "2.0 s (25%)")
    assert stall[-1] == ("all stall", "8.0 s")
    assert dict(s["events"]) == {"preemptions without notice": "1", "workers joined": "2", "workers attached (pools join)": "1",
                                 "rollout requests failed": "2", "shrinks": "1"}
    assert dict(s["time"]) == {"wall time": "5 min 12 s", "weight bytes fetched by workers": "20.0 MB"}


def test_a_quiet_run_says_none_happened_and_the_table_prints_plain_to_a_file():
    rows = _rows()[:3]  # the events are at steps 5-10
    s = run_summary(rows, totals={}, wall_s=9.0, status="interrupted")
    assert s["events"][0][0] == "none"
    buf = io.StringIO()
    print_run_summary(s, console=Console(file=buf, width=100))
    out = buf.getvalue()
    for want in ("run summary", "interrupted", "waiting for the next version", "transferring + applying weights",
                 "no preemption", "wall time", "9 s"):
        assert want in out, (want, out)
    assert "\x1b[" not in out  # no colour codes in a log file


def test_no_rows_is_an_empty_run_not_an_error():
    s = run_summary([], None, None, status="interrupted")
    assert dict(s["learning"]) == {"status": "interrupted", "steps": "0"}
    assert s["stall (worker-seconds over the run)"] == [("all stall", "0 s")]


def test_a_wall_time_just_short_of_a_minute_boundary_rounds_into_the_next_minute():
    wall = {w: dict(run_summary(_rows()[:1], totals={}, wall_s=w)["time"])["wall time"] for w in (419.6, 359.5, 119.7, 59.6)}
    assert wall == {419.6: "7 min 0 s", 359.5: "6 min 0 s", 119.7: "2 min 0 s", 59.6: "60 s"}
