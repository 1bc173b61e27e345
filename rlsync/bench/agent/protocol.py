"""The agent protocol: a worker process inside an emulated host, driven over its stdin/stdout.

    agent = Agent(topo, "ro0")                       # `ip netns exec <ns> python -m rlsync.bench.agent`
    agent.call("model", buf="w", mib=64, seed=0)     # allocate (and touch) a model in that process
    fut = agent.submit("fetch", client="rlsync", model="policy", buf="w", at=t_go)
    fut.result()["t1"]                               # CLOCK_MONOTONIC: the same clock in every namespace

The protocol is one JSON object per line each way: {"id", "cmd", "args"} in, {"id", "ok", "result" |
"error"} out; every command runs on its own thread, so a source keeps serving while it is asked
other things. `at=` (a monotonic time) makes a command start at that instant in every agent alike.
Commands live in a registry (`@command("name")`, on `rlsync.core.registry.Registry`), one `cmd_*.py`
file per system: rlsync's in `cmd_hub.py`, the baselines' in `cmd_gloo.py` and `cmd_ray_store.py`,
deltas' in `cmd_delta.py`, the gateway's in `cmd_federation.py`. This module is what both sides share
(the registry, `STATE`, the parent's `Agent` handle); only the agent's `__main__` imports the command
modules. Models are `rlsync.hub.tools.fakes.make_model(..., bucket_mib=...)`: flat buckets with per-tensor
views (how DeepSpeed/Megatron keep parameters), so every system reads and writes the very same memory,
warm (touched) first; every agent digests them with `fakes.digest`.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from rlsync.core.registry import Registry

log = logging.getLogger(__name__)

COMMANDS: Registry[Callable[..., Any]] = Registry("bench agent command")
command = COMMANDS.register

GO_DELAY_S = 0.3
"""A round's shared start instant is this far ahead: every agent has its command before it."""


class AgentState:
    """Everything one agent process holds between commands."""

    def __init__(self) -> None:
        self.models: dict[str, Any] = {}      # buf -> FakeModel (tensors: views into buckets)
        self.clients: dict[str, Any] = {}     # name -> HubClient
        self.hubs: dict[str, Any] = {}        # name -> HubServer
        self.extra: dict[str, Any] = {}       # baselines' state (gloo groups, ray handles, ...)


STATE = AgentState()


def join_hub(client: str, address: str, token: str, ip: str, location: dict, transport: str | None = None,
             streams: int = 2, chunk_mib: float = 8.0, io_timeout_s: float = 30.0, name: str = "worker") -> str:
    """Join a hub as client `client` of this agent (its data plane on `ip`); returns its worker id."""
    from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
    from rlsync.hub.dataplane.config import DataPlaneConfig

    cfg = ClientConfig(transport=transport, dataplane=DataPlaneConfig(host=ip, streams=streams,
                                                                   io_timeout_s=io_timeout_s),
                       manifest=ManifestConfig(chunk_bytes=int(chunk_mib * (1 << 20))))
    c = HubClient(address, token, config=cfg)
    wid = c.join(Location(**location), name=name)
    STATE.clients[client] = c
    return wid


# ---------------------------------------------------------------- parent side
class AgentError(RuntimeError):
    pass


class Agent:
    """The benchmark's handle on one agent process in `host`'s namespace."""

    def __init__(self, topo, host: str, env: dict | None = None) -> None:
        self.host, self.ip = host, topo.ip(host)
        e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = topo.popen(host, [sys.executable, "-m", "rlsync.bench.agent"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=e)
        self._n = 0
        self._lock = threading.Lock()
        self._hello: Future = Future()
        self._pending: dict[int, Future] = {0: self._hello}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def ready(self, timeout: float = 120) -> "Agent":
        self._hello.result(timeout)
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            fut = self._pending.pop(msg["id"], None)
            if fut is None:
                continue
            if msg["ok"]:
                fut.set_result(msg["result"])
            else:
                fut.set_exception(AgentError(f"{self.host}: {msg['error']}\n{msg.get('trace', '')}"))
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(AgentError(f"agent on {self.host} exited (code {self.proc.poll()})"))

    def submit(self, cmd: str, **args) -> Future:
        with self._lock:
            self._n += 1
            i = self._n
            fut = self._pending[i] = Future()
            try:
                self.proc.stdin.write(json.dumps({"id": i, "cmd": cmd, "args": args}) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                self._pending.pop(i, None)
                raise AgentError(f"agent on {self.host} is gone: {e}") from None
        return fut

    def call(self, cmd: str, timeout: float = 300, **args):
        return self.submit(cmd, **args).result(timeout)

    def close(self, timeout: float = 10) -> None:
        try:
            self.submit("exit").result(timeout)
        except Exception:  # noqa: BLE001 - killed below if it did not exit
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def close_agents(agents: list[Agent], timeout: float = 15) -> None:
    """Ask every agent to exit at once (workers before hubs are asked by the caller's order)."""
    futs = []
    for a in agents:
        try:
            futs.append((a, a.submit("exit")))
        except AgentError:
            pass
    deadline = time.monotonic() + timeout
    for a, f in futs:
        try:
            f.result(max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - killed below
            pass
    for a in agents:
        try:
            a.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            a.proc.kill()


def start_agents(topo, hosts: list[str], env: dict | None = None) -> dict[str, Agent]:
    """Start one agent per host (in parallel) and wait until each has imported and answered."""
    agents = {h: Agent(topo, h, env) for h in hosts}
    for a in agents.values():
        a.ready()
    return agents
