"""One local Ray cluster for the whole session (~7-10 s to start), and a tiny run config."""
import logging
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def ray_address():
    """GCS address of the session's Ray cluster (started here unless one is already up)."""
    import ray

    started = not ray.is_initialized()
    attempts = 3 if started else 0
    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
            break
        except Exception as e:  # Ray gives its raylet 30 s to register: a start-up race on a loaded machine
            if "timed out during startup" not in str(e) or attempt == attempts:
                raise
            logging.getLogger(__name__).warning("Ray start-up timed out (attempt %d of %d): retrying", attempt, attempts)
            ray.shutdown()
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


@pytest.fixture
def tiny_cfg(tmp_path):
    """A TrainConfig for a few fast steps: 1 trainer rank, 1 rollout worker, 4 prompts x 4 samples."""
    from rlsync.config.schema import TrainConfig
    from rlsync.pool.policies import PoolConfig

    def make(**over):
        cfg = TrainConfig(steps=4, run_dir=str(tmp_path / "run"), progress=False)
        cfg.rollout.prompts_per_step, cfg.rollout.group_size = 4, 4
        cfg.pools = {"main": PoolConfig(size=1)}
        cfg.logging.wandb.enabled = False
        cfg.checkpoint.enabled = False
        cfg.timeout_s = 120
        for k, v in over.items():
            obj = cfg
            *path, last = k.split(".")
            for p in path:
                obj = getattr(obj, p)
            setattr(obj, last, v)
        return cfg

    return make
