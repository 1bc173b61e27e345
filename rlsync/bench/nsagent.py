"""A worker process inside an emulated host, driven over its stdin/stdout by the benchmark.

    agent = Agent(topo, "ro0")                       # `ip netns exec <ns> python -m rlsync.bench.nsagent`
    agent.call("model", buf="w", mib=64, seed=0)     # allocate (and touch) a model in that process
    fut = agent.submit("fetch", client="rlsync", model="policy", buf="w", at=t_go)
    fut.result()["t1"]                               # CLOCK_MONOTONIC: the same clock in every namespace

The protocol is one JSON object per line each way: {"id", "cmd", "args"} in, {"id", "ok", "result" |
"error"} out; every command runs on its own thread, so a source keeps serving while it is asked
other things. `at=` (a monotonic time) makes a command start at that instant in every agent alike.
Commands live in a registry (`@command("name")`); rlsync's are here, the baselines' in
`rlsync.bench.baselines`. Models are flat buckets with per-tensor views (how DeepSpeed/Megatron
keep parameters), so every system reads and writes the very same memory, warm (touched) first.
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

log = logging.getLogger(__name__)

COMMANDS: dict[str, Callable[..., Any]] = {}


def command(name: str):
    def deco(fn):
        COMMANDS[name] = fn
        return fn
    return deco


class AgentState:
    """Everything one agent process holds between commands."""

    def __init__(self) -> None:
        self.models: dict[str, dict] = {}     # buf -> {"tensors": {name: view}, "buckets": [flat]}
        self.clients: dict[str, Any] = {}     # name -> HubClient
        self.hubs: dict[str, Any] = {}        # name -> HubServer
        self.extra: dict[str, Any] = {}       # baselines' state (gloo groups, ray handles, ...)


STATE = AgentState()


# ---------------------------------------------------------------- models
def build_model(mib: float, seed: int, n_layers: int = 8, bucket_mib: float = 16.0, zero: bool = False) -> dict:
    """A fake model of `mib` MiB (float32): n_layers big matrices + small norms/biases, laid out in
    flat buckets of about `bucket_mib` MiB; each tensor is a contiguous view into its bucket."""
    import torch

    big = max(1, int(mib * (1 << 20) / 4 / n_layers) - 2 * 256)
    shapes = []
    for i in range(n_layers):
        shapes += [(f"layers.{i}.weight", big), (f"layers.{i}.norm", 256), (f"layers.{i}.bias", 256)]
    cap = max(1, int(bucket_mib * (1 << 20) / 4))
    buckets_spec, cur, acc = [], [], 0
    for name, n in shapes:
        if cur and acc + n > cap:
            buckets_spec.append(cur)
            cur, acc = [], 0
        cur.append((name, n))
        acc += n
    buckets_spec.append(cur)
    g = torch.Generator().manual_seed(seed)
    tensors, buckets = {}, []
    for spec in buckets_spec:
        flat = torch.zeros(sum(n for _, n in spec), dtype=torch.float32)  # zeros: pages touched
        if not zero:
            flat.normal_(generator=g)
        off = 0
        for name, n in spec:
            tensors[name] = flat[off:off + n]
            off += n
        buckets.append(flat)
    return {"tensors": tensors, "buckets": buckets}


def digest(model: dict) -> str:
    import torch
    import xxhash
    h = xxhash.xxh3_128()
    for flat in model["buckets"]:
        h.update(flat.view(torch.uint8).numpy().data)  # any dtype (bf16 has no numpy twin)
    return h.hexdigest()


@command("ping")
def _ping() -> dict:
    return {"pid": os.getpid(), "python": sys.executable}


@command("model")
def _model(buf: str, mib: float, seed: int = 0, zero: bool = False, bucket_mib: float = 16.0) -> dict:
    m = STATE.models[buf] = build_model(mib, seed, zero=zero, bucket_mib=bucket_mib)
    return {"nbytes": sum(b.numel() * 4 for b in m["buckets"]), "digest": digest(m),
            "tensors": len(m["tensors"]), "buckets": len(m["buckets"])}


@command("mutate")
def _mutate(buf: str, step: int) -> dict:
    """A stand-in for the optimizer step: every weight changes (deterministically)."""
    m = STATE.models[buf]
    for flat in m["buckets"]:
        flat.add_(float(step))
    return {"digest": digest(m)}


@command("digest")
def _digest(buf: str) -> str:
    return digest(STATE.models[buf])


# ---------------------------------------------------------------- rlsync
@command("hub_start")
def _hub_start(name: str, ip: str, planner: dict | None = None, only_hosts: list[str] | None = None,
               worker_timeout_s: float = 30.0, delta: dict | None = None) -> dict:
    """Run a hub server in this process, bound to this namespace's address."""
    import secrets
    import tempfile

    from rlsync.hub import HubConfig, PlannerConfig
    from rlsync.hub.server.loop import HubServer

    planner = {**(planner or {}), "source_hosts": tuple(only_hosts or ())}
    from rlsync.hub.delta.plan import DeltaConfig
    cfg = HubConfig(planner=PlannerConfig(**planner), worker_timeout_s=worker_timeout_s,
                    delta=DeltaConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in (delta or {}).items()}))
    token = secrets.token_hex(16)
    journal = os.path.join(tempfile.mkdtemp(prefix=f"rlsync-bench-{name}-"), "journal.db")
    server = HubServer(host=ip, port=0, token=token, journal=journal, config=cfg)
    STATE.hubs[name] = server.start()
    return {"address": server.address, "token": token}


@command("hub_stats")
def _hub_stats(name: str) -> dict:
    s = STATE.hubs[name]
    return {"rpc_count": s.rpc_count, "rpc_bytes": s.bytes_in + s.bytes_out}


@command("join")
def _join(client: str, address: str, token: str, ip: str, location: dict, transport: str | None = None,
          streams: int = 2, chunk_mib: float = 8.0, io_timeout_s: float = 30.0, name: str = "worker") -> str:
    from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
    from rlsync.hub.dataplane.config import DataPlaneConfig

    cfg = ClientConfig(transport=transport, dataplane=DataPlaneConfig(host=ip, streams=streams,
                                                                   io_timeout_s=io_timeout_s),
                       manifest=ManifestConfig(chunk_bytes=int(chunk_mib * (1 << 20))))
    c = HubClient(address, token, config=cfg)
    wid = c.join(Location(**location), name=name)
    STATE.clients[client] = c
    return wid


@command("leave")
def _leave(client: str) -> bool:
    c = STATE.clients.pop(client, None)
    if c is not None:
        c.leave()
    return True


@command("publish")
def _publish(client: str, model: str, version: int, buf: str) -> dict:
    t0 = time.monotonic()
    committed = STATE.clients[client].publish(model, version, STATE.models[buf]["tensors"])
    return {"committed": committed, "t0": t0, "t1": time.monotonic()}


@command("release")
def _release(client: str, model: str, version: int) -> dict:
    t0 = time.monotonic()
    STATE.clients[client].release(model, version)
    return {"t0": t0, "t1": time.monotonic()}


@command("fetch")
def _fetch(client: str, model: str, buf: str, version: int | str = "latest", check: bool = True) -> dict:
    c = STATE.clients[client]
    t0 = time.monotonic()
    r = c.fetch(model, version, into=STATE.models[buf]["tensors"])
    t1 = time.monotonic()
    return {"t0": t0, "t1": t1, "version": r.version, "bytes_by_source": r.bytes_by_source,
            "transports": sorted(set(r.transports.values())),
            "digest": digest(STATE.models[buf]) if check else None}


@command("join_and_fetch")
def _join_and_fetch(join: dict, fetch: dict) -> dict:
    """An elastic joiner: join the hub, then fetch; t0 is taken before the join."""
    t0 = time.monotonic()
    _join(**join)
    r = _fetch(**fetch)
    r["t0"] = t0
    return r


@command("transports")
def _transports() -> list[str]:
    from rlsync.hub.dataplane.transports import available_transports
    return available_transports()


@command("exit")
def _exit() -> bool:
    return True


# ---------------------------------------------------------------- agent process main
def agent_main() -> int:
    from rlsync.hub.logs import setup_logging
    from . import baselines, delta_agent, fed_agent, raybase  # noqa: F401  (register the baselines', deltas', gateway's commands)

    setup_logging(os.environ.get("RLSYNC_AGENT_LOG", "WARNING"))
    out_lock = threading.Lock()
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints from libraries must not corrupt the protocol

    def reply(msg: dict) -> None:
        with out_lock:
            out.write(json.dumps(msg) + "\n")
            out.flush()

    def run(msg: dict) -> None:
        args = dict(msg.get("args") or {})
        at = args.pop("at", None)
        try:
            if at is not None:
                time.sleep(max(0.0, at - time.monotonic()))
            result = COMMANDS[msg["cmd"]](**args)
            reply({"id": msg["id"], "ok": True, "result": result})
        except BaseException as e:  # noqa: BLE001 - shipped to the parent
            import traceback
            reply({"id": msg["id"], "ok": False, "error": f"{type(e).__name__}: {e}",
                   "trace": traceback.format_exc()})

    reply({"id": 0, "ok": True, "result": {"pid": os.getpid()}})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            reply({"id": msg["id"], "ok": True, "result": True})
            break
        threading.Thread(target=run, args=(msg,), daemon=True).start()
    for c in list(STATE.clients.values()):
        try:
            c.leave()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
    for s in STATE.hubs.values():
        s.stop()
    os._exit(0)  # do not wait on library threads (gloo, ray) at exit


# ---------------------------------------------------------------- parent side
class AgentError(RuntimeError):
    pass


class Agent:
    """The benchmark's handle on one agent process in `host`'s namespace."""

    def __init__(self, topo, host: str, env: dict | None = None) -> None:
        self.host, self.ip = host, topo.ip(host)
        e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = topo.popen(host, [sys.executable, "-m", "rlsync.bench.nsagent"], stdin=subprocess.PIPE,
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


if __name__ == "__main__":
    # Run the registry of the importable module, not of `__main__` (which baselines cannot see).
    from rlsync.bench.nsagent import agent_main as _main
    sys.exit(_main())
