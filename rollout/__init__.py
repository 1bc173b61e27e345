"""rlsync.rollout: rollout workers' pieces — the sampling engine, tasks, rewards, models. See docs/trainer.md."""

from .engine import Rollout, RolloutEngine, WeightMismatchError
from .models import ModelPackageMissingError, TinyModelConfig, build_tiny_model, load_smollm2
from .rewards import Prompt, get_reward, register_reward
from .tasks import Task, build_task, get_task, register_task
from .tokenizer import CharTokenizer

__all__ = [
    "CharTokenizer", "ModelPackageMissingError", "Prompt", "Rollout", "RolloutEngine", "Task",
    "TinyModelConfig", "WeightMismatchError", "build_task", "build_tiny_model", "get_reward", "get_task",
    "load_smollm2", "register_reward", "register_task",
]
