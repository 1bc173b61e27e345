"""Held-out greedy evaluation every N steps, logged as `eval/*`.

    ev = Evaluator(cfg.eval, model=cfg.model, task=cfg.task, steps=cfg.steps, timeout_s=cfg.timeout_s)
    ev.run(driver, step, logger)        # at step 0 (the start) and every `every` steps: {"eval/reward_mean": ...}

The held-out prompts are prompts 0..n-1 of the task's stream under another seed (`eval.seed`), so they
never coincide with training prompts by index; for a task whose prompt space is small (single-digit
sums) some questions can repeat, which the docs say where figures are reported. One rollout worker
decodes them greedily with the weights of the version just published (it fetches them the way it
does for rollouts, through the run's `sync.mode`); the driver waits for it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import ray

from rlsync.config.schema import EvalConfig
from rlsync.workers.policy import ModelConfig, TaskConfig, build_policy, build_task

log = logging.getLogger(__name__)


class Evaluator:
    def __init__(self, e: EvalConfig, *, model: ModelConfig, task: TaskConfig, steps: int, timeout_s: float):
        """`e`: the run's `eval` section; `model`, `task`: the policy's (the held-out prompts use the model's
        tokenizer and the task under `e.seed`); `steps`: the run's last step; `timeout_s`: the driver's wait."""
        self.e, self.model, self.task, self.steps, self.timeout_s = e, model, task, steps, timeout_s
        self._prompts = None

    def due(self, step: int) -> bool:
        e = self.e
        return e.every > 0 and (step == 0 or step % e.every == 0 or step == self.steps)

    def prompts(self) -> list:
        if self._prompts is None:
            _, tok_task = build_policy(self.model, self.task, seed=0, tokenizer_only=True)  # no model: no seed
            task = build_task(dataclasses.replace(self.task, seed=self.e.seed), tok_task.tokenizer)
            self._prompts = [task.prompt_at(i) for i in range(self.e.prompts)]
        return self._prompts

    def run(self, driver, step: int, logger: Any = None) -> dict[str, float]:
        if not self.due(step):
            return {}
        handle = next((h for p in driver.pools.pools.values() for h in p.group.members.values()), None)
        if handle is None:
            return {}
        try:
            out = ray.get(handle.evaluate.remote(self.prompts(), step), timeout=self.timeout_s)
        except Exception as e:  # noqa: BLE001 - an eval lost with a preempted worker must not end the run
            log.warning("eval at step %d failed: %s", step, e)
            return {}
        m = {f"eval/{k}": v for k, v in out.items()}
        log.info("eval at step %d: reward %.3f, accuracy %.3f (%d held-out prompts, greedy)", step,
                 m["eval/reward_mean"], m["eval/accuracy"], len(self.prompts()))
        if logger is not None:
            logger.log({"step": step, **m}, step=step)
        return m
