"""Suite-wide set-up: offline model hub and wandb, and the order in which pytest-xdist hands out files.

CI runs the suite on 2 pytest-xdist workers (`.ci/run`: `-n 2`; `--dist loadfile` in pyproject.toml):
a whole test file goes to one worker, so module-scoped fixtures (one vLLM engine, one hub process)
start once, and the session's Ray cluster starts once per worker. The wall time is set by the slowest
files: they are handed out first (LONGEST_FIRST) so that two of them never end the run in series on
one worker while the other sits idle. Without -n, everything runs in this one process, in that order.
"""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

# Test files taking over ~15 s, longest first: an order, not figures (from the suite's --durations on
# 2 cores, 2026-11-23: the README's idle run for the top five, a run at load 12-40 for the rest; the files
# added on 2026-11-27 from that day's fresh-clone run, whose tail ran them in series at load 0.5).
# A new file over ~15 s belongs here, by its duration.
LONGEST_FIRST = [
    "rl/test_attach_from_shell.py",
    "rl/test_deterministic.py",
    "vllm/test_grpo_real_e2e.py",
    "rl/test_elastic_trainer.py",
    "hub/server/test_processes.py",
    "chaos/test_chaos.py",
    "rl/test_pools.py",
    "vllm/test_vllm_engine.py",
    "vllm/test_vllm_weight_transfer.py",
    "vllm/test_vllm_tp.py",
    "rl/test_plugins.py",
    "rl/test_verify.py",
    "rl/test_ecosystem_e2e.py",
    "rl/test_lora.py",
    "trainer/test_trainer_grpo_learns.py",
    "trainer/test_trainer_backend_deepspeed.py",
    "rl/test_zero3_sharded_rl.py",
    "trainer/test_zero3_sharded_publish.py",
    "hub/server/test_faults.py",
    "rl/test_rl_config.py",
    "hub/server/test_failover.py",
    "rl/test_resume_after_interrupt.py",
    "rl/test_rl_loop.py",
    "rl/test_export.py",
    "vllm/test_vllm_export.py",
    "rl/test_sync_modes.py",
    "bench/test_topo.py",
    "rl/test_rl_e2e.py",
    "rl/test_rl_stall.py",
    "hub/server/test_tenants.py",
    "hub/server/test_annotations.py",
]


def pytest_collection_modifyitems(config, items):
    """Listed files first (in their order), the rest after, each file's tests kept together in order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    here = os.path.dirname(os.path.abspath(__file__))

    def key(item):
        rel = os.path.relpath(str(item.path), here).replace(os.sep, "/")
        return rank.get(rel, len(rank))

    items[:] = sorted(items, key=key)  # stable: unlisted files keep pytest's collection order


def pytest_configure(config):
    """Before the workers start, in the controlling process: what two workers must not make at once."""
    if hasattr(config, "workerinput"):
        return
    _ray_auth_token()
    _deepspeed_shm_op()


def _ray_auth_token():
    """Ray 2.60 writes ~/.ray/auth_token on the first `ray.init` when it is missing; two workers (or
    their jobs) starting clusters at once would each write their own, and the cluster whose token was
    overwritten would refuse its own workers."""
    if os.environ.get("RAY_AUTH_MODE") == "disabled":
        return
    if not os.path.exists(os.path.join(os.path.expanduser("~"), ".ray", "auth_token")):
        from ray._private.authentication.authentication_token_setup import generate_and_save_token

        generate_and_save_token()  # what Ray's first `ray.init` on this machine would do


def _deepspeed_shm_op():
    """DeepSpeed compiles its CPU shared-memory op on first use (~65 s idle, minutes under load) into
    TORCH_EXTENSIONS_DIR (scripts/run sets it: one per venv, as the build embeds the venv's paths).
    Built inside a test, the compile runs under that test's timeout beside the other worker's test;
    killed midway, it leaves a lock that makes every later DeepSpeed start with that directory hang.
    So a venv without it starts the build here, before any test, in its own session (a Ctrl-C of the
    run does not cut it short), and tests start once it holds the build lock: a test reaching DeepSpeed
    before the build ends waits on that lock (torch's), while the other tests run meanwhile."""
    ext = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not ext or os.path.exists(os.path.join(ext, "deepspeed_shm_comm", "deepspeed_shm_comm.so")):
        return
    import subprocess
    import sys
    import time

    lock = os.path.join(ext, "deepspeed_shm_comm", "lock")
    os.makedirs(ext, exist_ok=True)
    with open(os.path.join(ext, "deepspeed_shm_comm.build.log"), "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    end = time.monotonic() + 300
    while proc.poll() is None and not os.path.exists(lock) and time.monotonic() < end:
        time.sleep(0.1)  # polling for the lock the build takes once DeepSpeed is imported (~5-10 s)


@pytest.fixture
def wait_until():
    """`wait_for` (tests/waiting.py): wait on a condition instead of sleeping."""
    from waiting import wait_for
    return wait_for
