"""`python -m rlsync.hub serve ...` runs a hub; `demo` shows one at work; `doctor` lists transports;
`calibrate` measures this host's data paths again and caches the choice (rlsync.hub.dataplane.tuning)."""
from __future__ import annotations

import argparse
import sys

from rlsync.hub import cli_args as V
from rlsync.hub.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlsync.hub", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run a hub server in the foreground")
    s.add_argument("--host", type=V.bind_host, default="127.0.0.1", help="bind address (loopback by default)")
    s.add_argument("--port", type=V.bind_port, default=0, help="port (0: pick a free one and print it)")
    s.add_argument("--token-file", type=V.file_to_create, required=True,
                   help="shared RPC token; created (0600) if missing, tightened to 0600 if looser")
    s.add_argument("--journal", type=V.file_to_create, required=True, help="SQLite journal of committed versions")
    s.add_argument("--worker-timeout", type=V.positive_float, default=15.0, help="expire workers silent this long (s)")
    s.add_argument("--reregister-grace", type=V.nonneg_float, default=5.0,
                   help="after a restart or an expiry, fetches finding no holder wait this long for workers to "
                        "re-register before the hub answers lost / not retained (s)")
    s.add_argument("--delta-mode", default="auto", choices=("auto", "always", "never"),
                   help="full version or chain of deltas per reader: by estimate, whenever a chain exists, never")
    s.add_argument("--delta-tier-gbps", type=V.float_list(4), default=None,
                   help="assumed link rates (Gbit/s) by distance: same host,rack,DC,other DC (e.g. 80,25,10,1)")
    s.add_argument("--tenants", type=V.existing_file, default=None,
                   help="YAML file of tenants (credential, scopes, quota, share) and per-model policy rules; "
                        "without it the token file's token alone has every scope (docs/tenants.md)")
    sd = sub.add_parser("seed", help="run a seed worker: takes hand-offs from leaving workers (and follows latest)")
    sd.add_argument("--address", type=V.hub_address, required=True, help="hub address, e.g. tcp://127.0.0.1:5555")
    sd.add_argument("--token-file", type=V.existing_file, required=True)
    sd.add_argument("--dc", default="dc0")
    sd.add_argument("--rack", default="rack0")
    sd.add_argument("--host", default="", help="host label (default: this machine's hostname)")
    sd.add_argument("--bind", type=V.bind_host, default="127.0.0.1", help="address its data-plane server binds")
    sd.add_argument("--follow", action="store_true", help="keep a copy of every model's latest version")
    d = sub.add_parser("demo", help="hub + publisher + N reader processes on loopback; print who read what")
    d.add_argument("--readers", type=V.positive_int, default=4)
    d.add_argument("--size-mb", type=V.positive_float, default=64.0)
    sub.add_parser("doctor", help="list data-plane transports: available here or not, and why")
    sub.add_parser("calibrate", help="measure every data path over loopback now; cache the fastest per peer class")
    a = p.parse_args(argv)
    if a.cmd == "calibrate":
        setup_logging()
        from rlsync.hub.dataplane.tuning import REMOTE, SAME_HOST, cache_file, load_or_calibrate
        cal = load_or_calibrate(refresh=True)
        for c, v in sorted(cal.measured.items(), key=lambda kv: -max(kv[1], default=0)):
            print(f"{c.label:24s} {' '.join(f'{x:.2f}' for x in v)} GB/s")
        print(f"load {cal.loadavg:.1f}; same host: {cal.choice(SAME_HOST).label}; remote: {cal.choice(REMOTE).label}")
        print(f"cached in {cache_file()}: every fetch on this host reads it")
        return 0
    if a.cmd == "doctor":
        from rlsync.hub.dataplane.transports import transport_report
        for name, ok, why in transport_report():
            print(f"{name:9s} {'available' if ok else 'unavailable'}{'' if ok else ': ' + why}")
        return 0
    if a.cmd == "serve":
        return run_serve(s, a)
    if a.cmd == "seed":
        setup_logging()
        return run_seed(a)
    setup_logging("WARNING")
    from rlsync.hub.tools.demo import run_demo
    return run_demo(a.readers, a.size_mb)


def run_serve(parser: argparse.ArgumentParser, a) -> int:
    from rlsync.hub.delta.plan import DeltaConfig
    from rlsync.hub.errors import HubError
    from rlsync.hub.server.loop import serve_main
    from rlsync.hub.server.tenancy import load_tenants_file
    from rlsync.hub.state import HubConfig
    try:
        if a.port:
            V.check_listen(a.host, a.port)
    except V.Bad as e:
        parser.error(f"argument --port: {e}")
    setup_logging()
    delta = DeltaConfig(mode=a.delta_mode, **({"tier_gbps": a.delta_tier_gbps} if a.delta_tier_gbps else {}))
    try:  # what the arguments passed but the hub refuses at start (an empty token file): one line too
        tenants, models = load_tenants_file(a.tenants) if a.tenants else ([], [])
        serve_main(a.host, a.port, a.token_file, a.journal, HubConfig(
            worker_timeout_s=a.worker_timeout, reregister_grace_s=a.reregister_grace, delta=delta,
            tenants=tenants, models=models))
    except HubError as e:
        parser.error(str(e))
    return 0


def run_seed(a) -> int:
    import signal
    import threading

    from rlsync.hub.client import ClientConfig, HubClient
    from rlsync.hub.dataplane.config import DataPlaneConfig
    from rlsync.hub.model.location import Location

    client = HubClient(a.address, token_file=a.token_file,
                       config=ClientConfig(dataplane=DataPlaneConfig(host=a.bind)))
    wid = client.join(Location(dc=a.dc, rack=a.rack, host=a.host), "seed", role="seed", follow=a.follow)
    print(f"seed worker {wid} joined {a.address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    client.leave(deadline_s=30.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
