"""Issue 7 acceptance: known delays in, known stall out, on the real loop (Ray actors, hub).

On-policy (k = 0) with one rollout worker, each step is: train step s -> publish v = s + 1 ->
the rollout worker (handed its prompts when step s started) waits for v = s + 1, fetches,
generates -> train step s + 1. An injected wait lands in the worker's `waiting_weights`; an injected
slow generation leaves the trainer in `waiting_data`. Step windows cut waits in two, so the
assertions are on means over the steps after the first (start-up).
"""
from statistics import mean

from rlsync.driver import Driver
from rlsync.telemetry.loggers import read_jsonl


def _run(cfg):
    Driver(cfg, cfg.run_dir).run()
    rows = read_jsonl(f"{cfg.run_dir}/metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, cfg.steps + 1))
    return rows[1:]


def test_rollout_waiting_half_a_second_for_weights_reads_half_a_second(ray_address, tiny_cfg):
    rows = _run(tiny_cfg(**{"rollout.max_staleness": 0, "inject.weights_delay_s": 0.5}))
    wait = mean(r["stall/rollout_wait_weights_s"] for r in rows)
    train = mean(r["timing_s/train"] for r in rows)
    # The injected 0.5 s starts when the step before is handed to the trainer, so it overlaps that
    # step's training: the wait is max(0.5, train) plus polling, never less than 0.5.
    assert 0.45 <= wait <= max(0.5, train) + 0.3, (wait, train)
    assert all(r["stall/total_s"] >= 0.4 for r in rows)                   # never ~0 on a stalled run
    assert mean(r["stall/rollout_idle_ratio"] for r in rows) > 0.3
    assert all(r["sync/fetches"] >= 1 and r["sync/bytes"] > 0 for r in rows)


def test_trainer_starved_of_data_reads_waiting_data(ray_address, tiny_cfg):
    rows = _run(tiny_cfg(**{"rollout.max_staleness": 0, "inject.generate_delay_s": 0.5}))
    starved = mean(r["stall/trainer_wait_data_s"] for r in rows)
    window = mean(r["stall/window_s"] for r in rows)
    assert starved >= 0.45, starved
    assert starved <= window
    assert mean(r["stall/trainer_idle_ratio"] for r in rows) > 0.5      # training-bound? no: data-bound
    assert all(r["stall/total_s"] >= 0.4 for r in rows)
