"""A multi-turn verifiers environment: `SumTaskset`'s questions, and an `Env` whose `run()` plays the user —
unless the reply is exactly the sum it says so and asks again, up to `max_tries` replies (TextArena's
pattern in verifiers: `agents.player.interaction(task)`, one `turn()` per model reply). The reward is the
last reply's rubric score times 0.8 per retry, recorded on the trace by the env."""

from __future__ import annotations

import verifiers.v1 as vf

from .arithmetic import SumData, SumTaskset, number_format


class RetryEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    max_tries: int = 2
    """Model replies per episode."""


class SumRetryEnv(vf.Env[RetryEnvConfig]):
    async def run(self, task, agents):
        max_tries = getattr(self.config, "max_tries", 2)
        score = 0.0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            for tries in range(1, max_tries + 1):
                if segment.terminated:
                    break
                raw = number_format(segment.last_reply, task.data.answer)
                score = raw * 0.8 ** (tries - 1)
                if raw >= 1.0 or tries == max_tries:
                    break
                segment = await interaction.turn(f"That is not just the right number. {task.data.question}")
        interaction.trace.record_reward("retry_number", score, 1.0)


class PlainSumTask(vf.Task[SumData]):
    """A sum without a rubric of its own: the env scores the whole episode."""


class SumRetryTaskset(SumTaskset):
    task_cls = PlainSumTask


__all__ = ["SumRetryEnv", "SumRetryTaskset"]
