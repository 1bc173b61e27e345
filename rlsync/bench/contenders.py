"""The transfer benchmark's contenders: rlsync's data plane (tcp native, tcp-py, shm), iperf3, Mooncake.

Each moves `size` bytes from one process to another per `once()`; `setup()` may raise `Skip`.
"""
from __future__ import annotations

import json
import logging
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path

from .provision import Skip, ensure_iperf3, ensure_mooncake

log = logging.getLogger(__name__)

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


class RlsyncSource:
    """The source process every rlsync contender reads from (rlsync.hub.dataplane.probe: the same
    source the data-path calibration measures against), and the reader-side state they share."""

    def __init__(self, size: int, chunk_bytes: int) -> None:
        from rlsync.hub.dataplane.probe import ProbeSource

        self.probe = ProbeSource(size, chunk_bytes)
        self.endpoint, self.manifest = self.probe.endpoint, self.probe.manifest

    def read(self, transport_name: str | None, streams: int | None, zero_copy: bool | None = True) -> float:
        """One read of every unit; None fields: what a client's reader picks (rlsync.hub.dataplane.tuning)."""
        from rlsync.hub.dataplane.tuning import choose_path

        transport, streams = choose_path(self.probe.mine, self.endpoint, transport_name, streams, zero_copy)
        return self.probe.read(transport, streams)

    def close(self) -> None:
        self.probe.close()


class RlsyncContender(Contender):
    """One rlsync read path; transport, streams and zero_copy None: the client's default (measured)."""

    def __init__(self, source: RlsyncSource, transport: str | None, streams: int | None, label: str,
                 zero_copy: bool | None = True, key: str = "") -> None:
        self.source, self.transport, self.streams, self.name = source, transport, streams, label
        self.zero_copy, self.key = zero_copy, key or transport or "default"

    def setup(self) -> None:
        from rlsync.hub.errors import TransportUnavailableError
        from rlsync.hub.dataplane.transports import get_transport

        if self.transport is None:
            return
        try:
            get_transport(self.transport)
        except TransportUnavailableError as e:
            raise Skip(str(e)) from None
        if self.transport not in self.source.endpoint.transports:
            raise Skip(f"the source process does not serve {self.transport!r}")

    def run_once(self) -> float:
        return self.source.read(self.transport, self.streams, self.zero_copy)


class Iperf3Contender(Contender):
    name, key = "iperf3 single stream", "iperf3"

    def __init__(self, size: int) -> None:
        self.size, self._server = size, None

    def setup(self) -> None:
        self._bin = ensure_iperf3()
        from rlsync.trainer import free_port
        self._port = free_port()
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
