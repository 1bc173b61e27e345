"""The ZeRO-3 RL loop with `trainer.publish=sharded` vs `gathered`, same config and seed (docs/resharding.md).

    scripts/run python examples/zero3_publish_compare.py [sharded] [gathered]

2 DeepSpeed ZeRO-3 ranks (Ray actors, gloo), 2 HF rollout workers, a tiny Llama, the `successor` task,
50 steps per mode (the config of tests/rl/test_zero3_sharded_rl.py). Prints one JSON line per mode: bytes
each trainer rank served, the most one rank served to one read, bytes of full-model copies gathered per
rank, reward (first 5 / last 10 steps), median step time. Runs under RUN_ROOT (default
/tmp/rlsync-zero3-compare) and writes RUN_ROOT/compare.json.
"""
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


def run(mode: str, root: str) -> dict:
    from rlsync.config.schema import TrainConfig
    from rlsync.pool.policies import PoolConfig
    from rlsync.driver import Driver

    run_dir = os.path.join(root, mode)
    cfg = TrainConfig(steps=50, run_dir=run_dir, progress=False)
    cfg.pools = {"main": PoolConfig(size=2)}
    cfg.logging.wandb.enabled, cfg.checkpoint.enabled, cfg.timeout_s = False, False, 300
    t = cfg.trainer
    t.backend, t.zero_stage, t.world_size, t.publish = "deepspeed", 3, 2, mode
    t.algo.optimizer.lr = 2e-3
    cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_staleness = 16, 8, 1
    cfg.task.name, cfg.task.args = "successor", {"length": 2, "symbols": "abcdef"}
    t0 = time.time()
    Driver(cfg, run_dir).run()
    wall = time.time() - t0
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    trace = json.load(open(os.path.join(run_dir, "trace.json")))["traceEvents"]
    fetches = [e["args"] for e in trace if e.get("name") == "fetch" and e.get("ph") == "i"]
    readers = {str(f["wid"]) for f in fetches}
    served, most = {}, 0
    for f in fetches:
        for w, n in f["bytes_by_source"].items():
            if w not in readers and n > 0:  # a trainer rank
                served[w] = served.get(w, 0) + n
                most = max(most, n)
    r = [x["reward/mean"] for x in rows]
    return {"mode": mode, "fetches": len(fetches), "model_bytes": fetches[0]["bytes"],
            "trainer_bytes_by_source": served, "max_bytes_one_trainer_rank_served_one_read": most,
            "trainer_gathered_bytes_per_rank_end": rows[-1]["sync/trainer_gathered_bytes"],
            "reward_first5": sum(r[:5]) / 5, "reward_last10": sum(r[-10:]) / 10,
            "median_step_s": sorted(x["timing_s/step"] for x in rows)[len(rows) // 2], "wall_s": wall}


def main(modes: list[str]) -> None:
    import ray

    root = os.environ.get("RUN_ROOT", "/tmp/rlsync-zero3-compare")
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    out = {}
    for mode in modes or ["sharded", "gathered"]:
        out[mode] = run(mode, root)
        print(json.dumps(out[mode]), flush=True)
    with open(os.path.join(root, "compare.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
