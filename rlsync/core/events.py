"""Typed records that cross process boundaries: what a fetch read, what a rollout call returns.

Workers ship them through Ray (return values) and through the stall clock (an `Event`'s attrs), so
every reader of a field reads the one declared here instead of `attrs.get("bytes", 0)` on a dict
whose keys are spelt in two other files.

    ev = FetchEvent.from_result(got, wid="w3", dc="dc1", join=True)   # got: a hub FetchResult
    clock.event(FetchEvent.NAME, **ev.attrs())                          # recorded on a worker
    FetchEvent.from_attrs(record.attrs).bytes_by_source                 # read back by the driver
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, kw_only=True)
class FetchEvent:
    """One completed fetch of a version into a worker's buffers (a reader, a seed, a re-formed trainer rank)."""

    NAME: ClassVar[str] = "fetch"
    version: int
    """The version now held."""
    bytes: int
    """Bytes read (the model's size when nothing was held before)."""
    seconds: float
    """Wall seconds from the fetch request to the last verified unit."""
    sources: tuple[str, ...] = ()
    """Hub worker ids that served bytes, sorted."""
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    """Hub worker id -> bytes it served."""
    transports: tuple[str, ...] = ()
    """Transports used, sorted."""
    wid: str = ""
    """The reader's hub worker id."""
    dc: str = ""
    """The reader's DC label (empty: the trainer's)."""
    join: bool = False
    """The first fetch of a worker joining a running job."""
    recover: bool = False
    """A trainer rank taking the latest committed weights back after its group re-formed."""
    mode: str = "full"
    """How it arrived (the hub's FetchResult.mode): 'full', 'delta' (a chain of deltas onto the version
    held; `bytes` is then the delta bytes) or 'held'."""

    @classmethod
    def from_result(cls, got: Any, **extra: Any) -> "FetchEvent":
        """From a hub `FetchResult` (version, nbytes, seconds, bytes_by_source, transports)."""
        return cls(version=got.version, bytes=got.nbytes, seconds=got.seconds, sources=tuple(sorted(got.bytes_by_source)),
                   bytes_by_source=dict(got.bytes_by_source), transports=tuple(sorted(set(got.transports.values()))),
                   **({"mode": got.mode} if isinstance(getattr(got, "mode", None), str) else {}), **extra)

    def attrs(self) -> dict[str, Any]:
        """The stall-clock event attributes (plain, picklable)."""
        d = dataclasses.asdict(self)
        d["sources"], d["transports"] = list(self.sources), list(self.transports)
        return d

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> "FetchEvent":
        """Back from an `Event`'s attrs; unknown keys are an error (a renamed field fails loudly)."""
        a = dict(attrs)
        a["sources"] = tuple(a.get("sources", ()))
        a["transports"] = tuple(a.get("transports", ()))
        return cls(**a)


@dataclass(kw_only=True)
class RolloutResult:
    """What one rollout call returns to the driver: scored groups (data, never weights) and their version."""

    worker: str
    """The worker key (`pool-i`)."""
    version: int
    """The weights version every sample of this call was generated with."""
    groups: list = field(default_factory=list)
    """One trainer `Batch` per prompt group."""
    generate_s: float = 0.0
    """Seconds spent generating and scoring."""
    completions: list = field(default_factory=list)
    """A few of the responses as text (`rlsync.telemetry.completions.Completion`), for the run's completions table."""
    unverified_versions: list = field(default_factory=list)
    """Versions the engine generated some of these samples with that then failed a check (docs/verify.md): the
    driver drops every group with a token of one of them, and counts it (`verify/quarantined_samples`)."""


@dataclass(kw_only=True)
class JoinResult:
    """What a rollout worker joining a running job reports: who it is in the hub and what its first fetch read."""

    worker: str
    """The worker key (`pool-i`)."""
    wid: str
    """Its hub worker id (the driver's map of fetch sources)."""
    pool: str
    """Its pool."""
    dc: str
    """The DC label it joined the hub with."""
    version: int
    """The version it holds after joining (-1: nothing published yet)."""
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    """Hub worker id -> bytes its first fetch read from it (empty when nothing was fetched)."""
