"""rlsync.rollout: rollout workers' pieces — engines (a registry: `hf`), tasks, rewards, model loaders. See docs/trainer.md.

Room rule: imports `rlsync.core` and the hub's public face (`from rlsync.hub import X`), never
`rlsync.trainer`, a private hub module or driver files (pyproject's import-linter contracts, checked by
tests/test_rooms.py). The vLLM engine lives in `vllm/` (docs/vllm.md).
"""

from .engine import Rollout, RolloutEngine, WeightMismatchError, build_hf_engine
from .models import (ModelLoader, ModelPackageMissingError, TinyModelConfig, build_tiny_model, load_smollm2)
from .registry import (ENGINES, MODEL_LOADERS, build_engine, register_engine, register_model_loader)
from .environment import Environment, EnvStep
from .episodes import generate_scored, run_episodes
from .rewards import Prompt, get_reward, register_reward
from .serving_gc import serving_gc
from .tasks import Task, build_task, get_task, register_task
from . import task_multiturn, task_reasoning_gym, task_verifiers  # noqa: F401,E402 - register their tasks
from .tokenizer import CharTokenizer
from .vllm import rl_engine  # noqa: F401 - registers rollout.engine=vllm (imports vLLM only when built)

__all__ = [
    "CharTokenizer", "ENGINES", "EnvStep", "Environment", "MODEL_LOADERS", "ModelLoader", "ModelPackageMissingError", "Prompt", "Rollout",
    "RolloutEngine", "Task", "TinyModelConfig", "WeightMismatchError", "build_engine", "build_hf_engine",
    "build_task", "build_tiny_model", "generate_scored", "get_reward", "get_task", "load_smollm2", "register_engine",
    "register_model_loader", "register_reward", "register_task", "run_episodes", "serving_gc",
]
