"""`Waker`: wake a thread blocked in a ZeroMQ poll from another thread, at once.

A pipe whose read end sits in the poller beside the sockets; `wake()` writes a byte (safe from any
thread, and after `close`). The hub's loop and a client's heartbeat watch poll with long timeouts
(the tick, the heartbeat period); without this, stopping either waited those out — 0.2 s per hub
and 1 s per leaving worker, which was most of the hub tests' wall time.
"""
from __future__ import annotations

import os
import threading


class Waker:
    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._lock = threading.Lock()

    @property
    def fd(self) -> int:
        """The read end: register it with `zmq.Poller.register(fd, zmq.POLLIN)`."""
        return self._r

    def wake(self) -> None:
        with self._lock:
            if self._w is not None:
                os.write(self._w, b"x")

    def clear(self) -> None:
        """Drain the wake-ups already sent (after the poll returned with `fd` ready)."""
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        with self._lock:
            if self._w is not None:
                os.close(self._w)
                os.close(self._r)
                self._w = None
