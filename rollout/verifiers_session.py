"""`VerifiersSession`: one verifiers episode as an rlsync `Environment` (task_verifiers.py says how it plays).

The env's `run(task, agents)` is a coroutine; it runs on this session's own event loop until it asks for
a model turn (`interaction.turn(...)`) or returns. `step(reply)` resumes it with the reply; `finish()`
(rlsync's turn budget is out) answers the pending turn with a terminated segment, as verifiers does at
its own turn limit. Scoring then runs the task's rubric on the trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .environment import Environment, EnvStep
from .rewards import Prompt

_STOP = object()  # the reply that ends the exchange (turn budget out)


class _Interaction:
    """The slice of verifiers' `Interaction` an env's run() uses: `turn(message)` and `trace`."""

    def __init__(self, session: "VerifiersSession", task: Any):
        import verifiers.v1 as vf
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        self.session, self._vf, self._node = session, vf, MessageNode
        self.trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key),
                              agent=AgentInfo(config=vf.AgentConfig()))
        msgs = ([vf.SystemMessage(content=task.data.system_prompt)] if task.data.system_prompt else [])
        prompt = task.data.prompt
        msgs += [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else list(prompt or [])
        for m in msgs:
            self._append(m, sampled=False)
        self.over = False

    def _append(self, message: Any, *, sampled: bool) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(self._node(parent=parent, message=message, sampled=sampled))

    async def turn(self, message: Any = None) -> Any:
        from verifiers.v1.agent import Segment

        if self.over:
            return Segment(messages=[], terminated=True)
        text = None
        if message is not None:
            text = message if isinstance(message, str) else "\n\n".join(
                str(m.get("content") if isinstance(m, dict) else getattr(m, "content", "")) for m in message)
            self._append(self._vf.UserMessage(content=text), sampled=False)
        elif self.trace.num_turns > 0:
            raise ValueError("a bare turn() after the first: the env must send the next user message")
        reply = await self.session.ask(text)
        if reply is _STOP:
            self.over = True
            return Segment(messages=[], terminated=True)
        answer = self._vf.AssistantMessage(content=reply)
        self._append(answer, sampled=True)
        return Segment(messages=[answer])


class _Agent:
    def __init__(self, session: "VerifiersSession"):
        self.session, self.trainable = session, True

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any):
        it = _Interaction(self.session, task)
        self.session.traces.append(it.trace)
        yield it

    async def run(self, task: Any) -> Any:
        """The single-agent case: one reply to the task's prompt."""
        async with self.interaction(task) as it:
            await it.turn()
        return it.trace


class _Agents:
    def __init__(self, session: "VerifiersSession"):
        self._session, self._agents = session, {}

    def __getattr__(self, name: str) -> _Agent:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._agents.setdefault(name, _Agent(self._session))


class VerifiersSession(Environment):
    def __init__(self, task: Any):
        self.task, self.traces = task, []
        self.loop = asyncio.new_event_loop()
        self.main: asyncio.Task | None = None
        self._asked: asyncio.Future | None = None
        self._reply: asyncio.Future | None = None

    async def ask(self, message: Any) -> Any:
        self._reply = self.loop.create_future()
        self._asked.set_result(message)
        return await self._reply

    async def _play(self, vf_task: Any) -> float:
        env = self._env()
        if env is None:
            await _Agents(self).agent.run(vf_task)
        else:
            await env.run(vf_task, _Agents(self))
        for trace in self.traces:
            await vf_task.score(trace)  # the task's @vf.reward methods and judges (no runtime)
        return float(sum(t.reward for t in self.traces))

    def _env(self) -> Any:
        cls = self.task.env_cls
        if cls is None:
            return None
        import verifiers.v1 as vf
        from verifiers.v1.utils.generic import concrete_type

        cfg_cls = concrete_type(cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
        env = object.__new__(cls)  # not Env.__init__: it loads harness programs this session does not run
        env.config = cfg_cls.model_construct(**dict(self.task.config.env_config))
        return env

    def _advance(self) -> EnvStep:
        """Run the env until it asks for the next model turn (its message) or returns (done, reward)."""
        self._asked = self.loop.create_future()
        self.loop.run_until_complete(asyncio.wait({self.main, self._asked}, return_when=asyncio.FIRST_COMPLETED))
        if self.main.done():
            return EnvStep(done=True, reward=self.main.result())  # raises what run() or scoring raised
        return EnvStep(text=self._asked.result())

    def reset(self, prompt: Prompt) -> None:
        super().reset(prompt)
        self.main = self.loop.create_task(self._play(prompt.info["vf_task"]))
        first = self._advance()
        if first.done or first.text is not None:
            raise ValueError(f"verifiers env {self.task.config.env!r} must take the model's reply to the task's "
                             "prompt first (a bare turn()); it ended or sent a message instead: not supported")

    def step(self, reply: str) -> EnvStep:
        self._reply.set_result(reply)
        return self._advance()

    def finish(self) -> float:
        self._reply.set_result(_STOP)
        step = self._advance()
        if not step.done:
            raise ValueError(f"verifiers env {self.task.config.env!r} asked for a turn after the exchange ended")
        return step.reward

    def close(self) -> None:
        if self.main is not None and not self.main.done():
            self.main.cancel()
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(self.main)
        self.loop.close()
