"""`verifiers`: a verifiers (PyPI `verifiers` 0.4, `verifiers.v1`) environment as a task, its rubric the reward.

    task.name=verifiers task.args.env=rlsync_arithmetic            # a Taskset whose Task has @vf.reward methods
    task.name=verifiers task.args.env=rlsync_arithmetic_retry      # an Env whose run() plays several turns
    task.name=verifiers task.args.env=textarena task.args.env_args={game: Wordle-v0}   # verifiers' own (downloads)

`env` is a verifiers taskset id: a built-in (`verifiers.v1.tasksets.<id>`), an installed environment
package, a dotted module path, or one of `BUNDLED` (rollout/vf_examples/, offline). `env_args` are the
taskset config's fields. The package's `Env` (if it exports one) runs the episode, else verifiers'
single-agent case: one reply to the task's prompt.

How it plays: every sample is an episode (environment.py). `VerifiersSession` runs the env's own
`run(task, agents)` coroutine on an event loop of its own, with `agents` that stand in for verifiers'
harness: each `interaction.turn(message)` pauses the coroutine and hands the turn to rlsync's episode
loop, which samples the reply with the engine (batched across episodes) and resumes it. When `run()`
returns, the task's `@vf.reward`s and judges score the trace (`Task.score`, no runtime) and the reward
is the trace's weighted sum (`Trace.reward`), plus what the env recorded itself.

Simplifies: no harness programs, sandboxes, MCP tools or interception server (the parts of verifiers
that run an agent program against an HTTP endpoint); rewards that need a runtime are skipped (verifiers
logs which); an env whose first turn is a message (a prompt-less task) is refused.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass, field
from typing import Any

from rlsync.core.errors import ConfigError

from .rewards import Prompt, register_reward
from .task_reasoning_gym import EXTRA_HINT, TaskLibraryMissingError
from .tasks import Task, register_task, text_prompt, text_tokenizer

BUNDLED = {"rlsync_arithmetic": "rlsync.rollout.vf_examples.arithmetic",
           "rlsync_arithmetic_retry": "rlsync.rollout.vf_examples.arithmetic_retry"}
"""Short names of the offline verifiers environments that ship with rlsync."""


def _vf():
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise TaskLibraryMissingError(f"task.name=verifiers needs the 'verifiers' package: {EXTRA_HINT}") from None
    return vf


def _exported(module: Any, base: type) -> type | None:
    found = [o for n in getattr(module, "__all__", []) if isinstance(o := getattr(module, n, None), type)
             and issubclass(o, base) and o is not base]
    return found[0] if len(found) == 1 else None


def load_env(env: str, env_args: dict, seed: int = 0) -> tuple[Any, type | None]:
    """(taskset, Env class or None) of verifiers environment `env`; `seed` goes to a taskset config's own
    `seed` field unless `env_args` sets it."""
    vf = _vf()
    from verifiers.v1.utils.generic import concrete_type
    from verifiers.v1.utils.loaders import import_taskset

    if not env:
        raise ValueError("set task.args.env to a verifiers environment (e.g. rlsync_arithmetic; "
                         f"bundled: {', '.join(BUNDLED)})")
    path = BUNDLED.get(env, env)
    module = importlib.import_module(path) if "." in path else import_taskset(path)
    ts_cls = _exported(module, vf.Taskset)
    if ts_cls is None:
        raise ValueError(f"task.args.env: {env!r} ({module.__name__}) exports no single verifiers Taskset in __all__")
    cfg_cls = concrete_type(ts_cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    args = dict(env_args)
    if "seed" in cfg_cls.model_fields:
        args.setdefault("seed", seed)
    return ts_cls(cfg_cls(id=path, **args)), _exported(module, vf.Env)


@register_reward("verifiers")
def verifiers_rubric(prompt: Prompt, response_ids: list[int], response_text: str) -> float:
    """Placeholder name: a verifiers task is scored by its environment's rubric in the episode loop."""
    raise TypeError("the `verifiers` reward is computed by the environment session (task.name=verifiers)")


@register_task("verifiers")
class VerifiersTask(Task):
    multi_turn = True

    @dataclass(kw_only=True)
    class Config(Task.Config):
        env: str = ""
        """verifiers taskset id: built-in, installed package, dotted module, or rlsync_arithmetic(_retry)."""
        env_args: dict[str, Any] = field(default_factory=dict)
        """Fields of the taskset's config (its `TasksetConfig` subclass)."""
        env_config: dict[str, Any] = field(default_factory=dict)
        """Fields of the env's config (its `EnvConfig` subclass), e.g. {max_tries: 3}."""
        max_turns: int = 4
        """Model replies per episode at most; then the env's interaction is told the exchange is over."""
        chat_template: bool = True
        """Render messages with the tokenizer's chat template (instruct models)."""
        reward: str = "verifiers"
        """The environment's rubric (not a registered function)."""
        max_response_tokens: int = 32
        """Tokens sampled per reply when the pool sets none (`response_len`)."""

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        """The environment must import and export a Taskset (a missing package is named here, before Ray)."""
        try:
            load_env(str(args.get("env", "")), dict(args.get("env_args", {})))
        except (ImportError, ValueError, TypeError) as e:
            raise ConfigError(f"task.args.env: {e}") from None

    def __init__(self, config: "VerifiersTask.Config | None" = None, tokenizer: Any = None):
        super().__init__(config, tokenizer)
        self.tokenizer = text_tokenizer(tokenizer)
        c = self.config
        self.taskset, self.env_cls = load_env(c.env, c.env_args, c.seed)
        # Prompt i is a pure function of (seed, i): the taskset's own seed, else a seeded order or offset.
        if "seed" in type(self.taskset.config).model_fields:
            view = self.taskset
        elif self.taskset.bounded:
            view = self.taskset.shuffle(c.seed)
        else:
            view = self.taskset.skip(c.seed * 7919 % 100_003)
        self._stream, self._tasks = iter(view), []

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    @property
    def response_len(self) -> int:
        return self.config.max_response_tokens

    def vf_task(self, index: int) -> Any:
        self._tasks += itertools.islice(self._stream, max(0, index + 1 - len(self._tasks)))
        if not self._tasks:
            raise ValueError(f"verifiers environment {self.config.env!r} yielded no tasks")
        return self._tasks[index % len(self._tasks)]

    def prompt_at(self, index: int) -> Prompt:
        t = self.vf_task(index)
        if t.data.prompt is None:
            raise ValueError(f"verifiers environment {self.config.env!r}: task {index} has no prompt (the env "
                             "opens the conversation): not supported")
        prompt = t.data.prompt if isinstance(t.data.prompt, str) else t.data.prompt_text
        text, ids = text_prompt(self.tokenizer, prompt, chat_template=self.config.chat_template,
                                system=t.data.system_prompt)
        return Prompt(index=index, text=text, prompt_ids=ids, answer=None, info={"vf_task": t})

    def make_env(self) -> "VerifiersSession":
        from .verifiers_session import VerifiersSession

        return VerifiersSession(self)


