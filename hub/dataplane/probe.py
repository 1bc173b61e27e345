"""A source process to measure data paths against: `size` bytes held as a full replica behind a real
`DataServer` in a second process, read by this one as a fetch would (ticket, framing, per-unit xxh3).

Used by the data-path calibration (rlsync.hub.dataplane.tuning) and by `python -m rlsync.bench
transfer`, so both measure the same thing. The source is a separate process on purpose (a plain
`python -m rlsync.hub.dataplane.probe` subprocess, so it starts from daemonic processes too): with the
source in the reader's own process (the calibration before) the server's and the reader's Python
loops share one GIL and `shm` reads its own address space: that calibration (128 MiB) had the TCP
paths ~30% slower than the benchmark between two processes measured them (1 GiB, docs/performance.md).

    src = ProbeSource(256 << 20)
    gbps = src.read(get_transport("shm"), streams=2)
    src.close()
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from rlsync.hub.protocol.messages import Endpoint

_REPLICA = "probe:live"


def _serve(size: int, chunk_bytes: int, public_key: bytes) -> None:
    """Child process: hold `size` bytes as a full replica, print where it is served (one JSON line
    on stdout), and serve it until stdin closes (the reader's stop, or its death)."""
    import torch

    from rlsync.hub.dataplane.config import DataPlaneConfig

    from rlsync.hub.dataplane.transfer import DataServer
    from rlsync.hub.model.manifest import ManifestConfig, build_manifest
    from rlsync.hub.dataplane.store import LocalReplica, ReplicaStore
    from rlsync.hub.protocol.tickets import TicketVerifier
    from rlsync.hub.dataplane.transports import endpoint_info

    block = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    data = block.repeat(size // block.numel() + 1)[:size].clone()  # touched: warm
    tensors = {"weights": data}
    manifest = build_manifest(tensors, ManifestConfig(chunk_bytes=chunk_bytes))
    store = ReplicaStore()
    store.add(LocalReplica(_REPLICA, manifest, tensors, full=True))
    server = DataServer(store, DataPlaneConfig())
    server.worker_id, server.verifier = "source", TicketVerifier(public_key)
    print(json.dumps({"endpoint": {"tcp": server.address, "pid": os.getpid(), "host": "local", **endpoint_info()},
                      "manifest": manifest.to_wire()}), flush=True)
    sys.stdin.read()
    server.close()


class ProbeSource:
    """The source process, and the reader-side state every read of it shares."""

    def __init__(self, size: int, chunk_bytes: int = 8 << 20, start_timeout_s: float = 300.0) -> None:
        import torch

        from rlsync.hub.model.manifest import Manifest
        from rlsync.hub.protocol.tickets import ReaderKey, Ticket, TicketSigner

        signer = TicketSigner()
        self.reader = ReaderKey()
        # A plain subprocess, not multiprocessing: it works from daemonic processes, and never
        # re-imports the caller's __main__ (a script without a main guard would run again).
        self._proc = subprocess.Popen([sys.executable, "-m", "rlsync.hub.dataplane.probe", str(size), str(chunk_bytes),
                                       signer.public_bytes.hex()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
        watchdog = threading.Timer(start_timeout_s, self._proc.kill)  # a hung start ends in EOF below
        watchdog.start()
        try:
            line = ""
            while not line.startswith("{"):  # skip anything else an import may print
                line = self._proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"the data-path probe source exited before serving (code {self._proc.poll()}; "
                                       f"killed after {start_timeout_s:.0f} s if it hung)")
            hello = json.loads(line)
        except BaseException:
            self.close()
            raise
        finally:
            watchdog.cancel()
        self.endpoint = Endpoint.from_wire(hello["endpoint"])
        self.manifest = Manifest.from_wire(hello["manifest"])
        self.ticket = signer.sign(Ticket("probe", "reader", self.reader.public_bytes, "source", _REPLICA,
                                         time.time() + 24 * 3600))
        self.into = {"weights": torch.zeros(size, dtype=torch.uint8)}  # zeros: pages touched, warm
        self.mine = Endpoint("reader:0", host=self.endpoint.host, boot_id=self.endpoint.boot_id)  # a same-host reader

    def read(self, transport, streams: int) -> float:
        """One read of every unit with `transport` (its `zero_copy` set) over `streams`; GB/s."""
        from rlsync.hub.dataplane.transfer import read_from_source
        from rlsync.hub.dataplane.store import LocalReplica

        dest = LocalReplica("probe:dest", self.manifest, self.into, full=False)
        units = list(range(len(self.manifest.units)))
        t0 = time.perf_counter()
        n = read_from_source(transport, self.endpoint, self.ticket, _REPLICA, units, dest, 60.0, streams=streams,
                             reader=self.reader)
        dt = time.perf_counter() - t0
        if not dest.complete or n != self.manifest.nbytes:
            raise RuntimeError(f"probe read moved {n} of {self.manifest.nbytes} bytes")
        return n / dt / 1e9

    def close(self) -> None:
        try:
            self._proc.stdin.close()  # the source's stop
        except OSError:
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._proc.stdout.close()


if __name__ == "__main__":  # python -m rlsync.hub.dataplane.probe SIZE CHUNK_BYTES PUBLIC_KEY_HEX
    _serve(int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3]))
