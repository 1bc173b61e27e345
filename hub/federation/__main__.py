"""`python -m rlsync.hub.federation`: run one DC's federation gateway (hub/federation/gateway.py).

    python -m rlsync.hub.federation --home tcp://10.0.0.1:5555 --home-token-file t0 \\
        --local tcp://10.1.0.1:5555 --local-token-file t1 --dc dc1 --model policy --stats gw.json
"""
from __future__ import annotations

import argparse
import json
import threading

from rlsync.hub import cli_args as V
from rlsync.hub.private_files import write_private_atomic


def _write_stats(path: str, gw) -> None:
    with gw._lock:
        data = json.dumps(gw.stats.to_json())
    write_private_atomic(path, data)  # readers see the old file or the new one, never half of one


def main(argv: list[str] | None = None) -> int:
    import signal
    p = argparse.ArgumentParser(prog="python -m rlsync.hub.federation",
                                description="run one DC's federation gateway (follows models from their home hub)")
    p.add_argument("--home", type=V.hub_address, required=True,
                   help="the home hub's address (the DC where the trainer publishes)")
    p.add_argument("--home-token-file", type=V.existing_file, required=True)
    p.add_argument("--local", type=V.hub_address, required=True, help="this DC's hub address")
    p.add_argument("--local-token-file", type=V.existing_file, required=True)
    p.add_argument("--dc", required=True, help="this DC's label (the gateway's location on both hubs)")
    p.add_argument("--rack", default="gateway")
    p.add_argument("--host", default="", help="host label (default: this machine's hostname)")
    p.add_argument("--bind", type=V.bind_host, default="127.0.0.1",
                   help="address the gateway's data-plane servers bind")
    p.add_argument("--model", type=V.model_name, action="append", required=True,
                   help="a model to follow (repeatable)")
    p.add_argument("--group", type=V.group, default=(1, 1), help="tp_size x pp_size of the models (e.g. 2x1)")
    p.add_argument("--chunk-mib", dest="chunk_bytes", type=V.mib, default=8 << 20,
                   help="the trainer's ManifestConfig.chunk_bytes, MiB (default 8)")
    p.add_argument("--poll-s", type=V.positive_float, default=0.05, help="how often to ask the home hub for latest")
    p.add_argument("--hub-deadline-s", type=V.positive_float, default=10.0,
                   help="how long one call waits for an unreachable hub before the gateway retries later")
    p.add_argument("--transport", default=None)
    p.add_argument("--no-deltas", action="store_true", help="always bring versions across in full")
    p.add_argument("--stats", type=V.file_to_create, default=None,
                   help="write the gateway's stats (JSON) here after every change (0600)")
    a = p.parse_args(argv)
    from rlsync.hub.client import ClientConfig, HubClient
    from rlsync.hub.dataplane.config import DataPlaneConfig
    from rlsync.hub.federation.gateway import Gateway, GatewayConfig
    from rlsync.hub.model.location import Location
    from rlsync.hub.logs import setup_logging
    from rlsync.hub.model.manifest import ManifestConfig
    setup_logging()
    cfg = ClientConfig(dataplane=DataPlaneConfig(host=a.bind), hub_deadline_s=a.hub_deadline_s,
                       transport=a.transport, manifest=ManifestConfig(chunk_bytes=a.chunk_bytes))
    gw = Gateway(HubClient(a.home, token_file=a.home_token_file, config=cfg),
                 HubClient(a.local, token_file=a.local_token_file, config=cfg),
                 GatewayConfig(models=tuple(a.model), group=a.group, poll_s=a.poll_s,
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



if __name__ == "__main__":
    import sys

    sys.exit(main())
