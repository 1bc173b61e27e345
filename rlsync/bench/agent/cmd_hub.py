"""Agent commands for rlsync itself and the models every system shares: a model in flat buckets,
its stand-in optimizer step and digest; a hub server in this host; a client's join, publish,
release and fetch. Registered in the agent's command registry (the agent's `__main__` imports this
module); every time is CLOCK_MONOTONIC read here, one clock in every namespace.
"""
from __future__ import annotations

import os
import sys
import time

from .protocol import STATE, command, join_hub


@command("ping")
def _ping() -> dict:
    return {"pid": os.getpid(), "python": sys.executable}


@command("model")
def _model(buf: str, mib: float, seed: int = 0, zero: bool = False, bucket_mib: float = 16.0) -> dict:
    from rlsync.hub.tools.fakes import digest, make_model  # (torch: not at the agent's start)
    m = STATE.models[buf] = make_model(mib, seed, zero=zero, bucket_mib=bucket_mib)
    return {"nbytes": sum(b.numel() * 4 for b in m.buckets), "digest": digest(m.tensors),
            "tensors": len(m.tensors), "buckets": len(m.buckets)}


@command("mutate")
def _mutate(buf: str, step: int) -> dict:
    """A stand-in for the optimizer step: every weight changes (deterministically)."""
    from rlsync.hub.tools.fakes import digest
    m = STATE.models[buf]
    for flat in m.buckets:
        flat.add_(float(step))
    return {"digest": digest(m.tensors)}


@command("digest")
def _digest(buf: str) -> str:
    from rlsync.hub.tools.fakes import digest
    return digest(STATE.models[buf].tensors)


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


command("join")(join_hub)


@command("leave")
def _leave(client: str) -> bool:
    c = STATE.clients.pop(client, None)
    if c is not None:
        c.leave()
    return True


@command("publish")
def _publish(client: str, model: str, version: int, buf: str) -> dict:
    t0 = time.monotonic()
    committed = STATE.clients[client].publish(model, version, STATE.models[buf].tensors)
    return {"committed": committed, "t0": t0, "t1": time.monotonic()}


@command("release")
def _release(client: str, model: str, version: int) -> dict:
    t0 = time.monotonic()
    STATE.clients[client].release(model, version)
    return {"t0": t0, "t1": time.monotonic()}


@command("fetch")
def _fetch(client: str, model: str, buf: str, version: int | str = "latest", check: bool = True) -> dict:
    from rlsync.hub.tools.fakes import digest
    c = STATE.clients[client]
    t0 = time.monotonic()
    r = c.fetch(model, version, into=STATE.models[buf].tensors)
    t1 = time.monotonic()
    return {"t0": t0, "t1": t1, "version": r.version, "bytes_by_source": r.bytes_by_source,
            "transports": sorted(set(r.transports.values())),
            "digest": digest(STATE.models[buf].tensors) if check else None}


@command("join_and_fetch")
def _join_and_fetch(join: dict, fetch: dict) -> dict:
    """An elastic joiner: join the hub, then fetch; t0 is taken before the join."""
    t0 = time.monotonic()
    join_hub(**join)
    r = _fetch(**fetch)
    r["t0"] = t0
    return r


@command("transports")
def _transports() -> list[str]:
    from rlsync.hub.dataplane.transports import available_transports
    return available_transports()
