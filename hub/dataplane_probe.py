"""A source process to measure data paths against: `size` bytes held as a full replica behind a real
`DataServer` in a second process, read by this one as a fetch would (ticket, framing, per-unit xxh3).

Used by the data-path calibration (rlsync.hub.dataplane_tuning) and by `python -m rlsync.bench
transfer`, so both measure the same thing. The source is a separate process on purpose: with the
source in the reader's own process (the calibration before) the server's and the reader's Python
loops share one GIL and `shm` reads its own address space: that calibration (128 MiB) had the TCP
paths ~30% slower and `shm x2` ~75% faster than the benchmark between two processes measured them an
hour later (1 GiB, docs/performance.md), and picked a path 0.72x the best one.

    src = ProbeSource(256 << 20)
    gbps = src.read(get_transport("shm"), streams=2)
    src.close()
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

_REPLICA = "probe:live"


def _serve(size: int, chunk_bytes: int, public_key: bytes, pipe) -> None:
    """Child process: hold `size` bytes as a full replica and serve them until told to stop."""
    import torch

    from .dataplane import DataPlaneConfig, DataServer
    from .manifest import ManifestConfig, build_manifest
    from .store import LocalReplica, ReplicaStore
    from .tickets import TicketVerifier
    from .transports import available_transports
    from .transports.shm import boot_id

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
    try:
        while pipe.recv() != "stop":
            pass
    except EOFError:  # the reader died: stop serving
        pass
    server.close()


class ProbeSource:
    """The source process, and the reader-side state every read of it shares."""

    def __init__(self, size: int, chunk_bytes: int = 8 << 20, start_timeout_s: float = 300.0) -> None:
        import torch

        from .manifest import Manifest
        from .tickets import ReaderKey, Ticket, TicketSigner

        signer = TicketSigner()
        self.reader = ReaderKey()
        ctx = mp.get_context("spawn")
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(size, chunk_bytes, signer.public_bytes, child), daemon=True)
        self._proc.start()
        child.close()
        try:
            if not self._pipe.poll(start_timeout_s):
                raise RuntimeError(f"the data-path probe source did not start within {start_timeout_s:.0f} s")
            hello = self._pipe.recv()
        except BaseException:
            self.close()
            raise
        self.endpoint = hello["endpoint"]
        self.manifest = Manifest.from_wire(hello["manifest"])
        self.ticket = signer.sign(Ticket("probe", "reader", self.reader.public_bytes, "source", _REPLICA,
                                         time.time() + 24 * 3600))
        self.into = {"weights": torch.zeros(size, dtype=torch.uint8)}  # zeros: pages touched, warm
        self.mine = {"boot_id": self.endpoint["boot_id"], "host": self.endpoint["host"]}  # a same-host reader

    def read(self, transport, streams: int) -> float:
        """One read of every unit with `transport` (its `zero_copy` set) over `streams`; GB/s."""
        from .dataplane import read_from_source
        from .store import LocalReplica

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
            self._pipe.send("stop")
        except OSError:
            pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
