"""Replicas this worker holds in memory, as the data-plane server sees them.

A `LocalReplica` is a view of live tensors (no copy) plus, per transfer unit, a present flag. A full
replica has every unit present. A relay (a fetch in progress) starts with none and gains them as
they arrive and verify; servers of downstream readers wait on its condition variable for units
not yet present (pipelined replication). `readers` counts reads being served right now; a
replica is removed only after the hub says no read is routed to it and `readers` is zero.
"""
from __future__ import annotations

import threading
import time

import torch

from rlsync.hub.errors import TransferError
from rlsync.hub.model.manifest import Manifest, byte_view


class LocalReplica:
    def __init__(self, replica_id: str, manifest: Manifest, tensors: dict[str, torch.Tensor],
                 full: bool) -> None:
        self.id = replica_id
        self.manifest = manifest
        self.tensors = tensors
        self.views = [byte_view(tensors[s.name]) for s in manifest.tensors]
        self.addresses = [tensors[s.name].data_ptr() for s in manifest.tensors]
        self.present = [full] * len(manifest.units)
        self.n_present = len(manifest.units) if full else 0
        self.failed: str | None = None
        self.readers = 0
        self.units_served = 0
        self.bytes_served = 0
        self.cond = threading.Condition()

    @property
    def complete(self) -> bool:
        return self.n_present == len(self.present)

    def mark_present(self, u: int) -> None:
        with self.cond:
            if not self.present[u]:
                self.present[u] = True
                self.n_present += 1
            self.cond.notify_all()

    def fail(self, why: str) -> None:
        with self.cond:
            self.failed = why
            self.cond.notify_all()

    def wait_unit(self, u: int, timeout_s: float) -> None:
        """Block until unit u is present (relay); raise TransferError if the relay failed or stalled."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not self.present[u]:
                if self.failed:
                    raise TransferError(f"relay {self.id} failed upstream: {self.failed}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferError(f"relay {self.id}: unit {u} did not arrive within {timeout_s}s")
                self.cond.wait(left)

    def begin_read(self) -> None:
        with self.cond:
            self.readers += 1

    def end_read(self, units: int, nbytes: int) -> None:
        with self.cond:
            self.readers -= 1
            self.units_served += units
            self.bytes_served += nbytes
            self.cond.notify_all()

    def wait_drained(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self.readers > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True


class ReplicaStore:
    """replica_id -> LocalReplica, shared by the client and its data-plane server threads."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._replicas: dict[str, LocalReplica] = {}
        self._gone: dict[str, None] = {}  # recently removed ids (bounded, insertion-ordered)

    def add(self, rep: LocalReplica) -> None:
        with self._lock:
            self._replicas[rep.id] = rep
            self._gone.pop(rep.id, None)
            self._lock.notify_all()

    def get(self, replica_id: str) -> LocalReplica | None:
        with self._lock:
            return self._replicas.get(replica_id)

    def get_or_wait(self, replica_id: str, timeout_s: float) -> LocalReplica | None:
        """The replica, waiting up to `timeout_s` for one not registered yet.

        The hub advertises a reader's relay when it plans the fetch, a moment before the reader
        hears the plan and registers the relay here; a downstream reader (with a valid ticket) may
        arrive in between. A replica removed here recently is answered at once: it is not coming back.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while replica_id not in self._replicas and replica_id not in self._gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            return self._replicas.get(replica_id)

    def remove(self, replica_id: str) -> LocalReplica | None:
        with self._lock:
            rep = self._replicas.pop(replica_id, None)
            self._gone[replica_id] = None
            while len(self._gone) > 4096:
                self._gone.pop(next(iter(self._gone)))
            self._lock.notify_all()
            return rep

    def all(self) -> list[LocalReplica]:
        with self._lock:
            return list(self._replicas.values())
