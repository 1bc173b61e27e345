"""Narrow configs (issue 31 item 4): every actor is built from its own sections plus the hub's address, never
the whole `TrainConfig`, and every value bound is declared in the metadata beside its field.

On the starting commit `TrainerWorker`, `RolloutWorker`, `SeedWorker`, `TrainerGroup`, `PoolSet` and
`build_policy` took `cfg: TrainConfig`, the workers imported `rlsync.config` (the circle
config ⇄ config_rules ⇄ driver/evaluation ⇄ workers/policy), and the bounds sat in a 33-row `RANGES` table
in `rlsync/config_rules.py`, far from the fields.
"""
import inspect
import subprocess
import sys

from rlsync.config.rules import bounded_values, describe
from rlsync.config.schema import TrainConfig


def test_no_actor_or_builder_takes_the_whole_run_config():
    from rlsync.pool.pool_set import PoolSet, rollout_group
    from rlsync.workers.policy import build_policy
    from rlsync.workers.rollout_worker import RolloutWorker
    from rlsync.workers.seed_worker import SeedWorker
    from rlsync.workers.trainer_group import TrainerGroup
    from rlsync.workers.trainer_worker import TrainerWorker

    for built in (TrainerWorker, RolloutWorker, SeedWorker, TrainerGroup, PoolSet, rollout_group, build_policy):
        params = inspect.signature(built).parameters
        assert "cfg" not in params, built
        assert not [p for p in params.values() if "TrainConfig" in str(p.annotation)], built
    # RolloutWorker names the sections it reads, one keyword each
    assert {"engine", "location", "rollout", "inject", "model", "task", "sync", "hub"} <= set(
        inspect.signature(RolloutWorker).parameters)


def test_the_actors_rooms_import_no_part_of_the_run_config():
    code = ("import sys; import rlsync.workers.trainer_group, rlsync.workers.rollout_worker, "
            "rlsync.workers.seed_worker, rlsync.pool.pool_set, rlsync.sync; "
            "bad = sorted(m for m in sys.modules if m.startswith(('rlsync.config', 'rlsync.driver')));"
            "assert not bad, bad")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def test_every_bound_sits_in_the_metadata_beside_its_field():
    import rlsync.config.rules as rules

    assert not hasattr(rules, "RANGES")
    bounds = {k: describe(b) for k, _, b in bounded_values(TrainConfig())}
    # a sample across rooms: the run's own fields, a worker's section, a pool's, an embedded engine's and trainer's
    assert bounds["steps"] == ">= 1" and bounds["trainer.zero_stage"] == "in 0..3"
    assert bounds["rollout.max_staleness"] == ">= 0" and bounds["pools.main.size"] == ">= 0"
    assert bounds["pools.main.engine.top_p"] == "> 0 and <= 1" and bounds["trainer.algo.optimizer.lr"] == "> 0"
    assert bounds["sync.wait_s"] == "in 0.001..600" and bounds["pools.main.churn.notice_fraction"] == "in 0..1"
    assert bounds["trainer.publish"] == "one of auto, gathered, sharded"
    assert len(bounds) >= 33
