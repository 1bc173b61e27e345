"""Held-out greedy evaluation every N steps, logged as `eval/*`.

    ev = Evaluator(cfg)                 # cfg.eval: every, prompts, seed
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
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class EvalConfig:
    every: int = 0
    """Evaluate at the start and every this many steps (and at the last step); 0: never."""
    prompts: int = 64
    """Held-out prompts per evaluation."""
    seed: int = 10_007
    """Seed of the held-out prompt stream (the training stream uses task.seed)."""


class Evaluator:
    def __init__(self, cfg):
        self.cfg = cfg
        self.e: EvalConfig = cfg.eval
        self._prompts = None

    def due(self, step: int) -> bool:
        e = self.e
        return e.every > 0 and (step == 0 or step % e.every == 0 or step == self.cfg.steps)

    def prompts(self) -> list:
        if self._prompts is None:
            from rlsync.workers.policy import build_task

            task_cfg = dataclasses.replace(self.cfg.task, seed=self.e.seed)
            _, tok_task = self._tokenizer_task()
            task = build_task(dataclasses.replace(self.cfg, task=task_cfg), tok_task.tokenizer)
            self._prompts = [task.prompt_at(i) for i in range(self.e.prompts)]
        return self._prompts

    def _tokenizer_task(self):
        from rlsync.workers.policy import build_policy

        return build_policy(self.cfg, tokenizer_only=True)

    def run(self, driver, step: int, logger: Any = None) -> dict[str, float]:
        if not self.due(step):
            return {}
        handle = next((h for p in driver.pools.pools.values() for h in p.group.members.values()), None)
        if handle is None:
            return {}
        import ray  # here, not at module level: the config schema (EvalConfig) stays Ray-free

        try:
            out = ray.get(handle.evaluate.remote(self.prompts(), step), timeout=self.cfg.timeout_s)
        except Exception as e:  # noqa: BLE001 - an eval lost with a preempted worker must not end the run
            log.warning("eval at step %d failed: %s", step, e)
            return {}
        m = {f"eval/{k}": v for k, v in out.items()}
        log.info("eval at step %d: reward %.3f, accuracy %.3f (%d held-out prompts, greedy)", step,
                 m["eval/reward_mean"], m["eval/accuracy"], len(self.prompts()))
        if logger is not None:
            logger.log({"step": step, **m}, step=step)
        return m
