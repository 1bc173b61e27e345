"""The price model of rlsync/sim/cost.py: pure arithmetic, milliseconds."""
from dataclasses import replace

from rlsync.sim.cost import JobModel, PriceModel, balance_sweep, compare

JOB = JobModel(steps=20, tokens_per_step=1e6, train_s=10.0, engines_on_demand=100, engine_gpus=1, trainer_gpus=8,
               tokens_per_engine_s=250.0, rollout_call_s=10.0)


def test_without_preemption_equal_cost_buys_engines_and_the_ratio_is_the_speed_up():
    r = compare(replace(PriceModel(), preempt_per_h=0.0, spot_fraction=0.5), JOB)
    assert r["engines_spot"] == 200
    # on-demand: 40 s of generation per step (rollout-bound); spot: 20 s; equal cost per hour
    assert r["on_demand"]["wall_s"] > 1.9 * r["spot_warm"]["wall_s"]
    assert r["spot_warm"]["preemptions"] == 0 and r["spot_warm"]["availability"] == 1.0
    assert abs(r["tokens_per_dollar_ratio_spot_vs_on_demand"] - r["on_demand"]["wall_s"] / r["spot_warm"]["wall_s"]) < 1e-9


def test_preemptions_cost_availability_and_warm_joiners_lose_less_than_cold():
    harsh = replace(PriceModel(), preempt_per_h=20.0, notice_fraction=0.0, provision_s=10.0, cold_start_s=120.0,
                    warm_start_s=10.0)
    r = compare(harsh, JOB)
    assert r["spot_cold"]["preemptions"] > 0
    assert r["spot_cold"]["availability"] < r["spot_warm"]["availability"] < 1.0
    calm = compare(replace(harsh, preempt_per_h=0.0), JOB)
    assert r["tokens_per_dollar_ratio_spot_cold_vs_on_demand"] < r["tokens_per_dollar_ratio_spot_warm_vs_on_demand"] \
        < calm["tokens_per_dollar_ratio_spot_warm_vs_on_demand"]


def test_a_trainer_bound_job_gains_nothing_from_more_engines():
    rows = balance_sweep(replace(PriceModel(), preempt_per_h=0.0), JOB)
    assert [r["gen_over_train_on_demand"] for r in rows][:2] == [0.5, 1.0]
    assert all(abs(r["warm"] - 1.0) < 0.05 for r in rows[:2]) and rows[-1]["warm"] > 2.5


def test_a_spot_side_that_needs_more_steps_to_the_same_reward_pays_for_them_in_reward_per_dollar():
    calm = replace(PriceModel(), preempt_per_h=0.0, spot_fraction=0.5)
    equal, slower = compare(calm, JOB), compare(calm, replace(JOB, spot_steps_factor=1.5))
    assert equal["reward_per_dollar_ratio_spot_warm_vs_on_demand"] == equal["tokens_per_dollar_ratio_spot_warm_vs_on_demand"]
    assert slower["spot_warm"]["steps"] == 30 and slower["on_demand"] == equal["on_demand"]
    # the tokens trained per dollar barely move; the dollars to reach the on-demand side's reward grow ~1.5x
    assert abs(slower["tokens_per_dollar_ratio_spot_warm_vs_on_demand"]
               - equal["tokens_per_dollar_ratio_spot_warm_vs_on_demand"]) < 0.1
    ratio = equal["reward_per_dollar_ratio_spot_warm_vs_on_demand"] / slower["reward_per_dollar_ratio_spot_warm_vs_on_demand"]
    assert 1.35 < ratio < 1.6
