"""The hub's bookkeeping records (workers, replicas, versions, fetches, pins) and release outcomes.

Plain data, no behaviour beyond a property: `HubState` (hub/state/__init__.py) and its protocol mixins own
the tables of these.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlsync.hub import errors as E
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import Manifest


@dataclass(slots=True)
class WorkerRec:
    id: str
    name: str
    location: Location
    endpoint: dict
    last_seen: float
    role: str = "worker"
    follow: bool = False
    tasks: list = field(default_factory=list)
    _peer: dict | None = None

    @property
    def peer_endpoint(self) -> dict:
        """The endpoint as a reader gets it in a plan: everything but this worker's own reader key
        (a reader proves itself with its own key; the source's is of no use to it, and 46 bytes per
        source per plan cross every link). Computed once: a record's endpoint never changes."""
        if self._peer is None:
            self._peer = {k: v for k, v in self.endpoint.items() if k != "reader_key"}
        return self._peer


@dataclass(slots=True)
class ReplicaRec:
    id: str
    worker: str
    model: str
    version: int
    shard: str
    slot: str
    full: bool
    releasing: bool = False
    origin: bool = False
    """Published by this worker (or its offload seed of such a copy), not fetched."""


@dataclass(slots=True)
class VersionRec:
    version: int
    group: tuple[int, int]
    manifests: dict[str, Manifest] = field(default_factory=dict)
    committed: bool = False
    annotations: dict[str, object] = field(default_factory=dict)
    """Small opaque values callers attach to the committed version (hub/state/annotations.py)."""


@dataclass(slots=True)
class FetchRec:
    id: str
    reader: str
    model: str
    version: int
    shard: str
    sources: dict[str, list[int]]
    relay: str
    started: float
    excluded: set[str] = field(default_factory=set)
    """Sources that failed this fetch: planned for it again only if no other replica can serve it."""
    failed_at: dict[str, float] = field(default_factory=dict)
    """When each source failed this fetch (until it is offered again): it is offered again once its
    worker was heard from after that (stalled, not dead), never before."""


@dataclass(slots=True)
class Pin:
    version: int
    size: int
    served: set[str] = field(default_factory=set)


@dataclass(slots=True)
class ModelRec:
    name: str
    versions: dict[int, VersionRec] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)
    pins: dict[str, Pin] = field(default_factory=dict)
    forgot_below: int = 0
    """Versions below this that are not in `versions` were forgotten (KEEP_OLD), not never committed."""

    @property
    def latest(self) -> int | None:
        return self.committed[-1] if self.committed else None


@dataclass(slots=True)
class Plan:
    fetch_id: str
    version: int
    manifest: Manifest
    sources: list[tuple[ReplicaRec, WorkerRec, list[int]]]
    held: bool = False
    """The reader already holds this version in full: nothing to transfer."""


class HolderSilentError(E.VersionLostError):
    """Not an answer: the server parks the replan until a holder that failed it is heard from again
    (then it is offered again) or expires (then the version is lost, after the re-registration grace)."""


class Release(str):
    """Outcome of a release step: DONE, SEED (copy first, then release again) or PENDING."""


DONE, SEED, PENDING = Release("done"), Release("seed"), Release("pending")
