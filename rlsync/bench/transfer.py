"""`python -m rlsync.bench transfer`: raw transfer rate between two processes on loopback.

    python -m rlsync.bench transfer --size 1GiB --json outputs/bench/transfer.json

Contenders, all measured in one run, each moving `--size` bytes from one process to another:
- rlsync `tcp` (native engine) with 1 and with `DataPlaneConfig.streams` parallel streams (and
  the latter again with the source copying instead of its zero-copy send,
  `NativeTcpTransport.zero_copy_send=False`),
  rlsync `tcp-py` and rlsync `shm`: a source process holds the bytes as a full replica behind a real
  `DataServer`; this process reads them with `read_from_source` into its own buffers — the same
  request framing, ticket check and per-unit xxh3 verification a fetch does (no control-plane RPC:
  the ticket is signed locally).
- `iperf3` single stream (`-n SIZE`, defaults otherwise): the machine's loopback TCP ceiling.
- Mooncake's transfer engine over TCP (`transfer_sync_write`, in its own venv so its wheels never
  touch the project's).
Buffers are allocated and touched before timing (warm). Repetitions are interleaved across
contenders (round-robin, after one untimed warm-up round) so load from other processes on a
shared machine falls on all of them alike; each figure is the median. Set-up installs what is
missing (`apt-get install -y iperf3`; Mooncake and its Debian libraries); a contender that cannot
run is skipped with the reason in the table and the JSON.
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from . import register_scenario

log = logging.getLogger(__name__)

_REPLICA = "bench:live"
_MOONCAKE_PKG = "mooncake-transfer-engine-non-cuda"
_MOONCAKE_DEBS = ["libibverbs1", "libnl-3-200", "libnl-route-3-200"]


class Skip(Exception):
    """A contender that cannot run here; the message says why."""


@dataclass(slots=True)
class Figure:
    name: str
    gbps: list[float] = field(default_factory=list)
    """GB/s (1e9 bytes per second) of each timed repetition."""
    skipped: str = ""
    """Why the contender did not run ('' if it ran)."""
    note: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.gbps) if self.gbps else None


def cpu_pressure() -> float | None:
    """Share of the last 10 s in which some runnable task waited for a CPU (Linux PSI), in percent."""
    try:
        return float(Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 1GiB, 256MiB, 1e9 as 1000000000")
    num, unit, binary = float(m.group(1)), m.group(2).upper(), m.group(3)
    scale = (1024 if binary or not unit else 1000) ** " KMGT".index(unit or " ")
    return int(num * scale)


# ---------------------------------------------------------------- set-up: installs what is missing
def _apt_install(pkgs: list[str]) -> None:
    if shutil.which("apt-get") is None:
        raise Skip(f"no apt-get to install {' '.join(pkgs)}")
    sudo = []
    if os.geteuid() != 0:
        if not shutil.which("sudo"):
            raise Skip(f"needs `apt-get install {' '.join(pkgs)}` and we are not root (no sudo)")
        sudo = ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*sudo, "apt-get", "install", "-y", "-q", *pkgs]
    r = subprocess.run(install, env=env, capture_output=True, text=True)
    if r.returncode != 0:  # stale package lists: refresh once and retry
        subprocess.run([*sudo, "apt-get", "update", "-q"], env=env, capture_output=True)
        r = subprocess.run(install, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"`apt-get install {' '.join(pkgs)}` failed: {r.stderr.strip().splitlines()[-1:]}")


def ensure_iperf3() -> str:
    if shutil.which("iperf3") is None:
        log.info("set-up: installing iperf3 (apt-get install -y iperf3)")
        _apt_install(["iperf3"])
    path = shutil.which("iperf3")
    if path is None:
        raise Skip("iperf3 is not installed and could not be")
    return path


def ensure_mooncake(cache: Path) -> str:
    """The python of a venv with Mooncake's transfer engine, created on first use."""
    venv = cache / "mooncake-venv"
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "from mooncake.engine import TransferEngine"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(py)
    log.info("set-up: installing %s into %s (and Debian %s)", _MOONCAKE_PKG, venv, " ".join(_MOONCAKE_DEBS))
    _apt_install(_MOONCAKE_DEBS)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", _MOONCAKE_PKG], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"pip install {_MOONCAKE_PKG} failed: {r.stderr.strip().splitlines()[-1:]}")
    r = subprocess.run(probe, capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"Mooncake installed but does not import: {r.stderr.strip().splitlines()[-1:]}")
    return str(py)


# ---------------------------------------------------------------- contenders
class Contender(ABC):
    name: str
    key: str
    """What `--skip` calls it."""

    def setup(self) -> None:
        """Start peers; raise Skip(reason) if this contender cannot run here."""

    @abstractmethod
    def run_once(self) -> float:
        """Move the bytes once; return GB/s."""

    def close(self) -> None:
        pass


def _serve_source(size: int, chunk_bytes: int, public_key: bytes, pipe) -> None:
    """Child process: hold `size` bytes as a full replica and serve them until told to stop.

    Between reads the parent may send ("zero_copy", bool) to switch the native engine's send mode.
    """
    import torch

    from rlsync.hub.dataplane import DataPlaneConfig, DataServer
    from rlsync.hub.manifest import ManifestConfig, build_manifest
    from rlsync.hub.store import LocalReplica, ReplicaStore
    from rlsync.hub.tickets import TicketVerifier
    from rlsync.hub.transports import available_transports
    from rlsync.hub.transports.shm import boot_id
    from rlsync.hub.transports.tcp_native import NativeTcpTransport

    block = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    data = block.repeat(size // block.numel() + 1)[:size].clone()  # touched: warm
    tensors = {"weights": data}
    manifest = build_manifest(tensors, ManifestConfig(chunk_bytes=chunk_bytes))
    store = ReplicaStore()
    store.add(LocalReplica(_REPLICA, manifest, tensors, full=True))
    server = DataServer(store, DataPlaneConfig())
    server.worker_id, server.verifier = "source", TicketVerifier(public_key)
    pipe.send({"endpoint": {"tcp": server.address, "pid": os.getpid(), "boot_id": boot_id(), "host": "local",
                            "transports": available_transports()},
               "manifest": manifest.to_wire()})
    while (msg := pipe.recv()) != "stop":
        NativeTcpTransport.zero_copy_send = bool(msg[1])
        pipe.send("ok")
    server.close()


class RlsyncSource:
    """The source process every rlsync contender reads from, and the reader-side state they share."""

    def __init__(self, size: int, chunk_bytes: int) -> None:
        import torch

        from rlsync.hub.manifest import Manifest
        from rlsync.hub.tickets import Ticket, TicketSigner

        signer = TicketSigner()
        ctx = mp.get_context("spawn")
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_source, args=(size, chunk_bytes, signer.public_bytes, child), daemon=True)
        self._proc.start()
        if not self._pipe.poll(300):
            raise RuntimeError("the rlsync source process did not start within 300 s")
        hello = self._pipe.recv()
        self.endpoint = hello["endpoint"]
        self.manifest = Manifest.from_wire(hello["manifest"])
        self.ticket = signer.sign(Ticket("bench", "reader", "source", _REPLICA, time.time() + 24 * 3600))
        self.into = {"weights": torch.zeros(size, dtype=torch.uint8)}  # zeros: pages touched, warm
        self._zero_copy: bool | None = None  # unknown: the first read sets it

    def read(self, transport_name: str, streams: int, zero_copy: bool = True) -> float:
        from rlsync.hub.dataplane import read_from_source
        from rlsync.hub.store import LocalReplica
        from rlsync.hub.transports import get_transport

        if zero_copy != self._zero_copy:  # the source's send mode, switched between reads
            self._pipe.send(("zero_copy", zero_copy))
            self._pipe.recv()
            self._zero_copy = zero_copy
        transport = get_transport(transport_name)
        dest = LocalReplica("bench:dest", self.manifest, self.into, full=False)
        units = list(range(len(self.manifest.units)))
        t0 = time.perf_counter()
        n = read_from_source(transport, self.endpoint, self.ticket, _REPLICA, units, dest, 60.0, streams=streams)
        dt = time.perf_counter() - t0
        assert dest.complete and n == self.manifest.nbytes
        return n / dt / 1e9

    def close(self) -> None:
        try:
            self._pipe.send("stop")
        except OSError:
            pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()


class RlsyncContender(Contender):
    def __init__(self, source: RlsyncSource, transport: str, streams: int, label: str, zero_copy: bool = True,
                 key: str = "") -> None:
        self.source, self.transport, self.streams, self.name = source, transport, streams, label
        self.zero_copy, self.key = zero_copy, key or transport

    def setup(self) -> None:
        from rlsync.hub.errors import TransportUnavailableError
        from rlsync.hub.transports import get_transport

        try:
            get_transport(self.transport)
        except TransportUnavailableError as e:
            raise Skip(str(e)) from None
        if self.transport not in self.source.endpoint["transports"]:
            raise Skip(f"the source process does not serve {self.transport!r}")

    def run_once(self) -> float:
        return self.source.read(self.transport, self.streams, self.zero_copy)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Iperf3Contender(Contender):
    name, key = "iperf3 single stream", "iperf3"

    def __init__(self, size: int) -> None:
        self.size, self._server = size, None

    def setup(self) -> None:
        self._bin = ensure_iperf3()
        self._port = _free_port()
        self._server = subprocess.Popen([self._bin, "-s", "-B", "127.0.0.1", "-p", str(self._port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)

    def run_once(self) -> float:
        for attempt in range(20):  # the server may still be starting, or finishing the previous test
            r = subprocess.run([self._bin, "-c", "127.0.0.1", "-p", str(self._port), "-n", str(self.size), "-J"],
                               capture_output=True, text=True)
            out = json.loads(r.stdout or "{}")
            if r.returncode == 0 and "error" not in out:
                recv = out["end"]["sum_received"]
                return recv["bytes"] / recv["seconds"] / 1e9
            time.sleep(0.2)
        raise RuntimeError(f"iperf3 client failed: {out.get('error', r.stderr)}")

    def close(self) -> None:
        if self._server is not None:
            self._server.terminate()
            self._server.wait(timeout=5)


class MooncakeContender(Contender):
    name, key = "Mooncake TCP (write)", "mooncake"

    def __init__(self, size: int, cache: Path) -> None:
        self.size, self.cache = size, cache
        self._target = self._initiator = None

    def _spawn(self, *args: str) -> subprocess.Popen:
        script = Path(__file__).with_name("_mooncake_peer.py")
        return subprocess.Popen([self._py, str(script), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)

    def _line(self, p: subprocess.Popen) -> dict:
        while True:
            line = p.stdout.readline()
            if not line:
                raise Skip(f"Mooncake peer exited (code {p.poll()}) before answering")
            if line.startswith("{"):
                return json.loads(line)

    def setup(self) -> None:
        self._py = ensure_mooncake(self.cache)
        self._target = self._spawn("target", str(self.size))
        hello = self._line(self._target)
        self._initiator = self._spawn("write", str(self.size), f"127.0.0.1:{hello['port']}", str(hello["ptr"]))
        self._line(self._initiator)

    def run_once(self) -> float:
        self._initiator.stdin.write("go\n")
        self._initiator.stdin.flush()
        r = self._line(self._initiator)
        if r["rc"] != 0:
            raise RuntimeError(f"Mooncake transfer_sync_write returned {r['rc']}")
        return self.size / r["seconds"] / 1e9

    def close(self) -> None:
        for p in (self._initiator, self._target):
            if p is not None:
                p.stdin.close()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()


# ---------------------------------------------------------------- the run
def run(size: int, reps: int, streams: int, skip: set[str], cache: Path, command: str = "",
        chunk_bytes: int | None = None) -> dict:
    from rlsync.hub.dataplane import DataPlaneConfig
    from rlsync.hub.manifest import ManifestConfig

    chunk_bytes = chunk_bytes or ManifestConfig().chunk_bytes
    source = RlsyncSource(size, chunk_bytes)
    contenders: list[Contender] = [
        RlsyncContender(source, "tcp", 1, "rlsync tcp (native, 1 stream)"),
        RlsyncContender(source, "tcp", streams, f"rlsync tcp (native, {streams} streams)"),
        RlsyncContender(source, "tcp", streams, f"rlsync tcp (native, {streams} streams, copying send)",
                        zero_copy=False, key="copy-send"),
        RlsyncContender(source, "tcp-py", 1, "rlsync tcp-py"),
        RlsyncContender(source, "shm", 1, "rlsync shm"),
        Iperf3Contender(size),
        MooncakeContender(size, cache),
    ]
    if streams == 1:
        contenders.pop(1)
        contenders[1].name = "rlsync tcp (native, 1 stream, copying send)"
    figures = {c.name: Figure(c.name) for c in contenders}
    running = []
    for c in contenders:
        if c.key in skip:
            figures[c.name].skipped = "skipped by --skip"
            continue
        try:
            c.setup()
            running.append(c)
        except Skip as e:
            figures[c.name].skipped = str(e)
            log.warning("%s: skipped: %s", c.name, e)
    load0, psi0 = os.getloadavg(), cpu_pressure()
    try:
        for rep in range(reps + 1):  # round 0 warms up, untimed
            for c in list(running):
                try:
                    g = c.run_once()
                except Exception as e:  # noqa: BLE001 - a contender failing mid-run is reported, not fatal
                    figures[c.name].skipped = f"failed: {e}"
                    log.warning("%s failed: %s", c.name, e)
                    running.remove(c)
                    continue
                if rep:
                    figures[c.name].gbps.append(g)
            log.info("round %d/%d done", rep, reps)
    finally:
        for c in contenders:
            c.close()
        source.close()
    default = next((f for n, f in figures.items() if n.startswith("rlsync tcp (native") and f"{streams} stream" in n), None)
    one = figures["rlsync tcp (native, 1 stream)"]
    copying = next((f for n, f in figures.items() if n.endswith("copying send)")), None)

    def ratio(a: Figure | None, b: str) -> float | None:
        fb = next((f for n, f in figures.items() if n.startswith(b)), None)
        return round(a.median / fb.median, 3) if a and fb and a.median and fb.median else None

    def paired(a: Figure | None, b: str) -> float | None:
        """Median over rounds of a/b within the round: steadier when other load comes and goes."""
        fb = next((f for n, f in figures.items() if n.startswith(b)), None)
        if not (a and fb and a.gbps and len(a.gbps) == len(fb.gbps)):
            return None
        return round(statistics.median(x / y for x, y in zip(a.gbps, fb.gbps)), 3)

    return {
        "scenario": "transfer",
        "size_bytes": size,
        "chunk_bytes": chunk_bytes,
        "reps": reps,
        "unit": "GB/s (1e9 bytes/s), median of reps",
        "native_streams": streams,
        "default_streams": DataPlaneConfig().streams,
        "figures": {n: {"median_gbps": f.median, "runs_gbps": [round(x, 4) for x in f.gbps], "skipped": f.skipped}
                    for n, f in figures.items()},
        "ratio_vs_iperf3": ratio(default, "iperf3"),
        "ratio_vs_mooncake": ratio(default, "Mooncake"),
        "ratio_vs_iperf3_1stream": ratio(one, "iperf3"),
        "ratio_zero_copy_vs_copy": ratio(default, copying.name) if copying else None,
        "paired_ratio_zero_copy_vs_copy": paired(default, copying.name) if copying else None,
        "ratio_vs_mooncake_1stream": ratio(one, "Mooncake"),
        "ratio_vs_tcp_py": ratio(default, "rlsync tcp-py"),
        "paired_ratio_vs_iperf3": paired(default, "iperf3"),
        "paired_ratio_vs_mooncake": paired(default, "Mooncake"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
                    "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                    "cpu_pressure_pct_before": psi0, "cpu_pressure_pct_after": cpu_pressure()},
        "command": command,
    }


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"transfer of {res['size_bytes'] / 2**30:.2f} GiB on loopback, median of {res['reps']}")
    t.add_column("contender")
    t.add_column("GB/s", justify="right")
    t.add_column("Gbit/s", justify="right")
    t.add_column("runs (GB/s) / reason skipped")
    for name, f in res["figures"].items():
        m = f["median_gbps"]
        t.add_row(name, f"{m:.2f}" if m else "-", f"{m * 8:.1f}" if m else "-",
                  " ".join(f"{x:.2f}" for x in f["runs_gbps"]) if m else f["skipped"])
    c = Console()
    c.print(t)
    m = res["machine"]
    c.print(f"machine: {m['cpus']} CPUs, load {m['loadavg_before'][0]:.1f} -> {m['loadavg_after'][0]:.1f}, "
            f"CPU pressure {m['cpu_pressure_pct_before']}% -> {m['cpu_pressure_pct_after']}% (shared machine)")
    for k in ("ratio_vs_iperf3", "ratio_vs_mooncake", "ratio_vs_iperf3_1stream", "ratio_vs_mooncake_1stream",
              "ratio_vs_tcp_py", "paired_ratio_vs_iperf3", "paired_ratio_vs_mooncake",
              "ratio_zero_copy_vs_copy", "paired_ratio_zero_copy_vs_copy"):
        c.print(f"{k}: {res[k]}")


@register_scenario("transfer")
def main(argv: list[str]) -> int:
    from rlsync.hub.dataplane import DataPlaneConfig

    p = argparse.ArgumentParser(prog="python -m rlsync.bench transfer", description=__doc__.split("\n")[0])
    p.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="bytes per transfer (1GiB, 256MiB)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per contender (median reported)")
    p.add_argument("--streams", type=int, default=DataPlaneConfig().streams,
                   help="parallel streams for the native engine's multi-stream row")
    p.add_argument("--chunk-bytes", type=parse_size, default=None,
                   help="transfer unit size of the source's manifest (default ManifestConfig.chunk_bytes, 8MiB)")
    p.add_argument("--skip", action="append", default=[],
                   help="contender to leave out: iperf3, mooncake, shm, tcp-py, copy-send")
    p.add_argument("--cache", type=Path, default=Path(os.environ.get("RLSYNC_BENCH_CACHE", "~/.cache/rlsync/bench")),
                   help="where set-up keeps the Mooncake venv")
    p.add_argument("--json", type=Path, help="write every figure and the ratios here")
    a = p.parse_args(argv)
    res = run(a.size, a.reps, a.streams, {s.lower() for s in a.skip}, a.cache.expanduser(),
              command=" ".join(["python -m rlsync.bench transfer", *argv]), chunk_bytes=a.chunk_bytes)
    print_table(res)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2))
        log.info("wrote %s", a.json)
    return 0
