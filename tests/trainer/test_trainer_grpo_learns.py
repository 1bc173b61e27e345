"""End to end on one process: GRPO from random init learns the synthetic `successor` task.

Rollout engine samples, the task scores, the torch backend trains, weights go back to the engine
through the sync interfaces. Seeded; measured curves are in docs/trainer.md.
"""

import statistics

import pytest

from rlsync.local import LocalLoopConfig, run_local_loop

STEPS = 90


@pytest.mark.timeout(300)  # ~12 s on an idle 2-core machine; much more when it is shared
def test_grpo_reward_rises_on_successor_task():
    hist = run_local_loop(LocalLoopConfig(task="successor", seed=0, steps=STEPS))
    assert len(hist) == STEPS
    first = statistics.mean(h["reward_mean"] for h in hist[:5])
    last = statistics.mean(h["reward_mean"] for h in hist[-10:])
    assert first < 0.15, "random init should score about chance (1/16 per position)"
    assert last - first >= 0.3, f"reward rose only {first:.3f} -> {last:.3f}"
    assert hist[-1]["entropy"] < hist[0]["entropy"]
    # The engine's behaviour log-probs match the trainer's: on-policy, the ratio is 1.
    assert max(h["approx_kl"] for h in hist) < 1e-9
    assert all(h["staleness_max"] == 0 for h in hist)
