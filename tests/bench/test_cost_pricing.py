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


def _run(dt: float, members: float, rewards: list[float], pool: str) -> list[dict]:
    return [{"step": i + 1, "time": i * dt, "reward/mean": r, f"pool/{pool}/members": members}
            for i, r in enumerate(rewards)]


def test_equal_final_reward_is_priced_up_to_the_first_step_whose_10_step_mean_reaches_the_target():
    from rlsync.bench.cost import seed_ratios, summarize
    rewards = [0.0] * 10 + [1.0] * 10  # trailing 10-step mean >= 0.5 first at step 15 (row 14)
    od = price_run(_run(2.0, 1.0, rewards, "main"), "main", 1.0, 1.0, 10, target=0.5)
    spot = price_run(_run(1.0, 3.0, rewards[:12] + [1.0] * 30, "spot"), "spot", 0.35, 1.0, 10, target=0.5)
    assert od["at_target"]["step"] == 15 and od["at_target"]["cost"] == 14 * 2.0 * (1.0 + 1.0)
    assert od["at_target"]["tokens"] == 14 * 10 * TOKENS_PER_SAMPLE
    assert spot["at_target"]["step"] == 15 and abs(spot["at_target"]["cost"] - 14 * (1.0 + 3 * 0.35)) < 1e-9
    missed = price_run(_run(1.0, 1.0, [0.3] * 20, "main"), "main", 1.0, 1.0, 10, target=0.5)
    assert missed["at_target"] is None and missed["final_reward"] == 0.3
    r = seed_ratios(od, spot)
    assert abs(r["dollars_to_target_on_demand_over_spot"] - 56.0 / 28.7) < 1e-9
    assert r["steps_to_target_spot_over_on_demand"] == 1.0
    assert r["final_reward_difference"] == 0.0  # both end on ten 1.0s: the longer spot run is not compared at its end
    s = summarize([{"seed": 0, "ratios": r}, {"seed": 1, "ratios": seed_ratios(od, missed)}])
    assert s["seeds_reached_target"] == 1 and s["tokens_per_dollar_at_target"]["values"] == [r["tokens_per_dollar_at_target"]]
    assert s["reward_per_dollar_ratio_spot_vs_on_demand"] == r["dollars_to_target_on_demand_over_spot"]
    assert s["final_reward_difference"]["min"] == -0.7  # the seed that missed still shows its plateau's gap


def test_a_kept_run_is_priced_again_only_if_it_was_run_with_the_same_settings(tmp_path):
    import json

    from rlsync.bench.cost import _kept
    cfg = {"steps": 2, "seed": 1, "inject": {"generate_delay_s": 0.25}, "rollout": {"prompts_per_request": 8}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i}) + "\n" for i in (1, 2)))
    assert _kept(str(tmp_path), 2, 1, 0.25, 8) == [{"step": 1}, {"step": 2}]
    assert _kept(str(tmp_path), 2, 1, 0.0, 8) is None  # another device time: run again, not priced as this one
    assert _kept(str(tmp_path), 3, 1, 0.25, 8) is None and _kept(str(tmp_path / "none"), 2, 1, 0.25, 8) is None
