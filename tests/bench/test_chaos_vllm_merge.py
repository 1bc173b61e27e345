"""`bench chaos_vllm` in chunks: trials keyed by (seed, index), summed by `chaos_vllm_merge`. Pure, milliseconds."""
import pytest

from rlsync.bench._chaos_vllm_engine import _split
from rlsync.bench.chaos_vllm import trial_rng
from rlsync.bench.chaos_vllm_merge import ChunkMismatch, merge


def _trial(seed, index, behind=0, **kw):
    return {"seed": seed, "index": index, "versions_behind": behind, "killed_in": "apply", "trial_s": 10.0,
            "load_1m": 1.0, "restart_s": 5.0, "split": {"engine_start": 4.0}, **kw}


def _chunk(trials, **kw):
    return {"kill": "engine", "trials": len(trials), "trainer_hangs": 0, "failed_steps": 0,
            "unverified_samples_trained": 0, "unverified_samples_offered": 0, "wall_s": 30.0, "trial_list": trials,
            **kw}


def test_a_trial_draws_the_same_whichever_chunk_runs_it():
    first = [trial_rng(1, i).random() for i in range(4)]
    assert [trial_rng(1, i).random() for i in (2, 3)] == first[2:]  # a chunk starting at trial 2
    assert len(set(first)) == 4 and trial_rng(2, 0).random() != first[0]


def test_chunks_add_up_to_the_issues_keys():
    a = _chunk([_trial(0, 0), _trial(0, 1, behind=1)], failed_steps=1)
    b = _chunk([_trial(1, 0, trial_s=20.0), _trial(2, 0, killed_in="fetch")], trainer_hangs=2,
               unverified_samples_offered=2)
    m = merge([a, b])
    assert (m["trials"], m["seeds"], m["trials_per_seed"]) == (4, [0, 1, 2], {"0": 2, "1": 1, "2": 1})
    assert (m["trainer_hangs"], m["failed_steps"], m["unverified_samples_trained"]) == (2, 1, 0)
    assert m["unverified_samples_offered"] == 2 and m["killed_in"] == {"apply": 3, "fetch": 1}
    assert m["rejoin_versions_behind_max"] == 1 and m["rejoins_within_one_version"] == 4
    assert (m["trial_s"], m["trial_s_max"], m["wall_s"]) == (12.5, 20.0, 60.0)


def test_a_trial_without_a_rejoin_sample_fails_the_rejoin():
    t = _trial(0, 0)
    del t["versions_behind"]  # killed or hung before its first sample
    m = merge([_chunk([t, _trial(0, 1)])])
    assert m["rejoin_versions_behind_max"] > 1 and m["rejoins_within_one_version"] == 1


def test_overlapping_or_mixed_chunks_are_refused():
    with pytest.raises(ChunkMismatch, match="trial 1 of seed 0 is in chunks 0 and 1"):
        merge([_chunk([_trial(0, 0), _trial(0, 1)]), _chunk([_trial(0, 1)])])
    with pytest.raises(ChunkMismatch, match="different kills"):
        merge([_chunk([_trial(0, 0)]), _chunk([_trial(0, 1)], kill="hub")])


def test_a_trial_splits_into_consecutive_parts():
    marks = {"t0": 0.0, "phase": 2.0, "kill": 2.1, "reaped": 2.3, "taken": 3.3, "started": 6.3, "fetch": 6.8,
             "apply": 7.8, "applied": 8.3, "generate": 8.3, "sample": 9.3}
    s = _split(marks)
    assert s["to_kill_phase"] == 2.0 and s["spare_wait"] == 1.0 and s["engine_start"] == 3.0
    assert s["first_fetch"] == 1.0 and abs(sum(s.values()) - 9.3) < 1e-9
    del marks["sample"]  # never sampled: the parts around it are left out, not guessed
    assert "first_generate" not in _split(marks) and _split(marks)["first_fetch"] == 1.0


def test_a_trial_kills_the_live_engine_and_ends_at_the_restarted_ones_verified_sample():
    import os
    import sys

    from rlsync.bench._chaos_vllm_engine import Live, Spares, engine_trial

    class Trainer:
        version = 7

    spares = Spares("unused", "unused", "unused")
    spares.cmd = [sys.executable, os.path.join(os.path.dirname(__file__), "scripted_chaos_child.py"), "6"]
    spares.refill()
    try:
        live = Live.start(spares, Trainer())
        first = live.proc
        t, live = engine_trial(trial_rng(0, 0), spares, Trainer(), live)
        assert first.returncode == -9 and live.proc is not first and live.proc.poll() is None
        assert t["exit"] == -9 and t["hung"] == 0 and "restart_s" in t
        assert t["unverified"] == 2 and t["samples"] == 2  # the restarted engine's early sample is not trained
        assert t["versions_behind"] == 1  # its first verified sample is of v6, the trainer at v7
        assert {"to_kill_phase", "reap", "engine_start", "first_generate"} <= set(t["split"])
    finally:
        spares.close()
        live.proc.kill()
        live.proc.wait()
