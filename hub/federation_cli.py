"""`python -m rlsync.hub.federation`: run one DC's federation gateway (hub/federation.py).

    python -m rlsync.hub.federation --home tcp://10.0.0.1:5555 --home-token-file t0 \\
        --local tcp://10.1.0.1:5555 --local-token-file t1 --dc dc1 --model policy --stats gw.json
"""
from __future__ import annotations

import argparse
import json
import os
import threading

from .client import ClientConfig, HubClient
from .federation import Gateway, GatewayConfig
from .location import Location


def _write_stats(path: str, gw: Gateway) -> None:
    with gw._lock:
        data = json.dumps(gw.stats.to_json())
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one


def main(argv: list[str] | None = None) -> int:
    import signal

    from .client_config import DataPlaneConfig
    from .logs import setup_logging
    from .manifest import ManifestConfig
    p = argparse.ArgumentParser(prog="python -m rlsync.hub.federation",
                                description="run one DC's federation gateway (follows models from their home hub)")
    p.add_argument("--home", required=True, help="the home hub's address (the DC where the trainer publishes)")
    p.add_argument("--home-token-file", required=True)
    p.add_argument("--local", required=True, help="this DC's hub address")
    p.add_argument("--local-token-file", required=True)
    p.add_argument("--dc", required=True, help="this DC's label (the gateway's location on both hubs)")
    p.add_argument("--rack", default="gateway")
    p.add_argument("--host", default="", help="host label (default: this machine's hostname)")
    p.add_argument("--bind", default="127.0.0.1", help="address the gateway's data-plane servers bind")
    p.add_argument("--model", action="append", required=True, help="a model to follow (repeatable)")
    p.add_argument("--group", default="1x1", help="tp_size x pp_size of the models (e.g. 2x1)")
    p.add_argument("--chunk-mib", type=float, default=8.0, help="the trainer's ManifestConfig.chunk_bytes, MiB")
    p.add_argument("--poll-s", type=float, default=0.05)
    p.add_argument("--hub-deadline-s", type=float, default=10.0,
                   help="how long one call waits for an unreachable hub before the gateway retries later")
    p.add_argument("--transport", default=None)
    p.add_argument("--no-deltas", action="store_true", help="always bring versions across in full")
    p.add_argument("--stats", default=None, help="write the gateway's stats (JSON) here after every change")
    a = p.parse_args(argv)
    setup_logging()
    tp, _, pp = a.group.partition("x")
    cfg = ClientConfig(dataplane=DataPlaneConfig(host=a.bind), hub_deadline_s=a.hub_deadline_s,
                       transport=a.transport, manifest=ManifestConfig(chunk_bytes=int(a.chunk_mib * (1 << 20))))
    gw = Gateway(HubClient(a.home, token_file=a.home_token_file, config=cfg),
                 HubClient(a.local, token_file=a.local_token_file, config=cfg),
                 GatewayConfig(models=tuple(a.model), group=(int(tp), int(pp)), poll_s=a.poll_s,
                               deltas=not a.no_deltas),
                 on_change=(lambda g: _write_stats(a.stats, g)) if a.stats else None)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    gw.start(Location(dc=a.dc, rack=a.rack, host=a.host))
    if a.stats:
        _write_stats(a.stats, gw)
    print(f"rlsync gateway {gw.stats.local_wid} in {a.dc}: home {a.home} ({gw.stats.home_wid}), local {a.local}",
          flush=True)
    stop.wait()
    gw.stop()
    return 0

