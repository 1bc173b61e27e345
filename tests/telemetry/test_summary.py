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


def test_the_off_policy_section_shares_dropped_of_generated_mixed_spans_clip_and_decode_pause():
    rows = _rows()[:4]
    for r, (gen, drop, mixed, spans, corr, clip) in zip(rows, [(256, 0, 0.0, 1.0, 0.0, 0.0), (256, 8, 0.5, 1.5, 0.2, 0.1),
                                                              (256, 0, 0.25, 1.25, 0.1, 0.3), (232, 0, 0.0, 1.0, 0.0, 0.0)]):
        r.update({"staleness/generated": gen, "staleness/dropped": drop, "offpolicy/mixed_sample_frac": mixed,
                  "offpolicy/spans_per_sample": spans, "offpolicy/corrected_token_frac": corr,
                  "offpolicy/clip_frac": clip})
    s = run_summary(rows, totals={"staleness/dropped_total": 8})
    assert dict(s["off-policy"]) == {
        "samples dropped past the version-age cap": "8 of 1000 (0.80%)",
        "mixed-version samples (mean per step)": "18.8%",            # (0 + 50 + 25 + 0) / 4
        "version spans per sample": "1.19",                          # (1 + 1.5 + 1.25 + 1) / 4
        "tokens corrected (sampled by an older version)": "7.5%",
        "correction clip fraction (ratio beyond the cap)": "20.00%",  # steps that corrected: (0.1 + 0.3) / 2
    }
    rows[1].update({"sync/decode_pause_s": 0.006, "sync/engine_updates": 2.0})
    rows[2].update({"sync/decode_pause_s": 0.003, "sync/engine_updates": 1.0})
    assert dict(run_summary(rows, totals={})["off-policy"])["decode pause per update"] == "3.0 ms"
    assert "off-policy" not in run_summary(_rows()[:3], totals={})  # a run that logged none of it
