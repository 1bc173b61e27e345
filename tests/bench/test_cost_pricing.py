"""`bench cost` prices a run from its metrics.jsonl rows: pure, milliseconds."""
from rlsync.bench.cost import TOKENS_PER_SAMPLE, price_run


def test_a_run_is_priced_by_its_live_members_and_trained_samples():
    rows = [{"time": 0.0, "reward/mean": 0.1, "pool/spot/members": 3.0},
            {"time": 10.0, "reward/mean": 0.5, "pool/spot/members": 3.0, "staleness/dropped": 4.0,
             "timing_s/generate": 6.0, "timing_s/train": 2.0},
            {"time": 30.0, "reward/mean": 0.7, "pool/spot/members": 2.0, "events/preemptions": 1.0,
             "timing_s/generate": 3.0, "timing_s/train": 1.0}]
    r = price_run(rows, "spot", worker_price=0.5, trainer_price=1.0, samples_per_step=10)
    assert r["cost"] == 10 * (1.0 + 3 * 0.5) + 20 * (1.0 + 2 * 0.5)  # a preempted worker stops billing
    assert r["tokens"] == (6 + 10) * TOKENS_PER_SAMPLE  # dropped (stale) samples are not trained
    assert r["preemptions"] == 1.0 and abs(r["final_reward"] - (0.1 + 0.5 + 0.7) / 3) < 1e-12
    assert r["tokens_per_dollar"] == r["tokens"] / r["cost"]
    assert r["generate_over_train"] == 3.0  # worker-seconds generating per trainer-second: how rollout-bound
