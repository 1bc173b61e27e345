"""Ray's object store across the emulated hosts (storage's shape): the trainer `put`s, readers `get`.

Placeholder until the Ray-in-namespaces set-up lands: `start()` returns why it does not run.
"""
from __future__ import annotations


class RayObjectStore:
    def __init__(self, cluster) -> None:
        self.c = cluster

    def start(self) -> str | None:
        return "not wired yet"

    def round(self, readers):
        raise NotImplementedError

    def close(self) -> None:
        pass
