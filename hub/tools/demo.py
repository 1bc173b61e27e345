"""`python -m rlsync.hub demo`: a hub, a publisher and N readers as real processes on loopback.

It starts the hub server as its own process (`python -m rlsync.hub serve`), publishes a model
from a "trainer" process, has N reader processes fetch it at once, and prints who read what from
whom — bytes, source worker, transport, time — and how many bytes the hub itself moved (only
control messages: it stores and forwards no weights).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.table import Table

from rlsync.hub.client import HubClient
from rlsync.hub.tools.procs import WorkerProcess, close_all


def start_hub_process(workdir: str, port: int = 0, worker_timeout_s: float = 15.0,
                      stderr=None, reregister_grace_s: float = 5.0,
                      extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str, str]:
    """Start `python -m rlsync.hub serve` and wait until it listens; returns (proc, address, token).
    `stderr`: where its log goes (a file object; default: inherited); `extra`: more `serve` flags."""
    token_file = os.path.join(workdir, "hub.token")
    cmd = [sys.executable, "-m", "rlsync.hub", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--token-file", token_file, "--journal", os.path.join(workdir, "journal.db"),
           "--worker-timeout", str(worker_timeout_s), "--reregister-grace", str(reregister_grace_s), *extra]
    env = dict(os.environ, RLSYNC_LOG=os.environ.get("RLSYNC_HUB_LOG", "WARNING"))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"hub did not start: {line!r}")
    address = line.strip().rsplit(" ", 1)[1]
    return proc, address, open(token_file).read().strip()


def run_demo(readers: int = 4, size_mb: float = 64.0) -> int:
    console = Console(width=120)
    with tempfile.TemporaryDirectory(prefix="rlsync-demo-") as tmp:
        hub, address, token = start_hub_process(tmp)
        workers: list[WorkerProcess] = []
        try:
            console.print(f"hub: {address} (pid {hub.pid})")
            trainer = WorkerProcess(address, token, name="trainer")
            workers.append(trainer)
            trainer.join(dc="dc0", rack="r0", host="trainer-host")
            pub = trainer.call("publish", model="policy", version=1, size_mb=size_mb, seed=0)
            console.print(f"trainer {trainer.wid} published policy v1 ({size_mb:.0f} MB), committed={pub['committed']}")
            readers_ = []
            for i in range(readers):
                w = WorkerProcess(address, token, name=f"reader{i}")
                workers.append(w)
                # Half the readers share a host label with each other: the planner prefers them.
                w.join(dc="dc0", rack="r0", host=f"rollout-host{i // 2}")
                readers_.append(w)
            names = {w.wid: w.name for w in workers}
            t0 = time.monotonic()
            tags = [w.start("fetch", model="policy", version="latest") for w in readers_]
            res = [w.wait(t) for w, t in zip(readers_, tags)]
            wall = time.monotonic() - t0
            table = Table(title=f"policy v1: {readers} readers, {size_mb:.0f} MB each, {wall:.2f}s wall")
            for col in ("reader", "version", "served by (bytes)", "transport", "seconds", "GB/s", "bit-exact"):
                table.add_column(col)
            ok = True
            for w, r in zip(readers_, res):
                exact = r["digest"] == pub["digest"]
                ok &= exact
                src = ", ".join(f"{names.get(s, s)} ({b / 1e6:.0f} MB)" for s, b in r["bytes_by_source"].items())
                tr = ", ".join(sorted(set(r["transports"].values())))
                table.add_row(f"{w.name} ({w.wid})", str(r["version"]), src, tr, f"{r['seconds']:.2f}",
                              f"{r['nbytes'] / r['seconds'] / 1e9:.2f}", "yes" if exact else "NO")
            console.print(table)
            probe = HubClient(address, token)
            stats = probe.stats()
            moved = sum(sum(r["bytes_by_source"].values()) for r in res)
            console.print(f"peer-to-peer weight bytes: {moved / 1e6:.0f} MB; hub control traffic: "
                          f"{(stats['rpc_bytes_in'] + stats['rpc_bytes_out']) / 1e3:.1f} kB "
                          f"in {stats['rpc_count']} RPCs (the hub moves no weight bytes)")
            return 0 if ok else 1
        finally:
            close_all(workers)
            hub.terminate()
            hub.wait(10)
