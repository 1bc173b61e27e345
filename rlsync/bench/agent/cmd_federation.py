"""Agent commands for the federated cross-DC benchmark (`python -m rlsync.bench fedcrossdc`): run a
federation gateway (rlsync.hub.federation.gateway.Gateway) in this emulated host and wait for its commits.
Registered in the agent's command registry (the agent's `__main__` imports this module)."""
from __future__ import annotations

import threading
import time

from .protocol import STATE, command


def _client_cfg(ip: str, transport: str | None, streams: int, chunk_mib: float, io_timeout_s: float):
    from rlsync.hub import ClientConfig, ManifestConfig
    from rlsync.hub.dataplane.config import DataPlaneConfig
    return ClientConfig(transport=transport, dataplane=DataPlaneConfig(host=ip, streams=streams, io_timeout_s=io_timeout_s),
                        manifest=ManifestConfig(chunk_bytes=int(chunk_mib * (1 << 20))))


@command("gateway_start")
def _gateway_start(home: dict, local: dict, ip: str, location: dict, transport: str | None = None,
                   streams: int = 1, chunk_mib: float = 0.5, io_timeout_s: float = 120.0, poll_s: float = 0.05,
                   deltas: bool = True) -> dict:
    """Start this DC's gateway: a client of the home hub and of this DC's hub, following `policy`
    (`deltas`: bring a version across as its delta when the home hub says so)."""
    from rlsync.hub import HubClient, Location
    from rlsync.hub.federation.gateway import Gateway, GatewayConfig

    seen: dict[int, float] = {}
    cond = threading.Condition()

    def changed(gw) -> None:
        with cond:
            for r in gw.stats.replicated:
                seen.setdefault(r.version, time.monotonic())  # CLOCK_MONOTONIC: one clock in every namespace
            cond.notify_all()
    cfg = _client_cfg(ip, transport, streams, chunk_mib, io_timeout_s)
    gw = Gateway(HubClient(home["address"], home["token"], config=cfg),
                 HubClient(local["address"], local["token"], config=cfg),
                 GatewayConfig(models=("policy",), poll_s=poll_s, deltas=deltas), on_change=changed)
    STATE.extra["gateway"] = (gw, seen, cond)
    gw.start(Location(**location))
    return {"home_wid": gw.stats.home_wid, "local_wid": gw.stats.local_wid}


@command("gateway_wait")
def _gateway_wait(version: int, within: float = 600.0) -> dict:
    """Block until the gateway committed `version` (or a newer one) in its DC; when it did, and how."""
    gw, seen, cond = STATE.extra["gateway"]
    end = time.monotonic() + within
    with cond:
        while not any(v >= version for v in seen) and (left := end - time.monotonic()) > 0:
            cond.wait(left)
        got = [v for v in seen if v >= version]
        if not got:
            raise TimeoutError(f"gateway: v{version} not committed within {within}s; failures {gw.stats.failures[-3:]}")
        v = min(got)
        rec = next(r for r in gw.stats.replicated if r.version == v)
        return {"version": v, "t": seen[v], "cross_bytes": rec.cross_bytes, "nbytes": rec.nbytes, "mode": rec.mode,
                "bytes_by_source": rec.bytes_by_source, "fetch_s": rec.fetch_s, "publish_s": rec.publish_s}


@command("gateway_stop")
def _gateway_stop() -> bool:
    gw, _, _ = STATE.extra.pop("gateway")
    gw.stop()
    return True
