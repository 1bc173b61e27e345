"""`SyncStats`: what one update of a vLLM engine's weights cost (`HubWeightStage`, the in-flight switch)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True, slots=True)
class SyncStats:
    version: int
    fetch_s: float
    """Fetch into staging (for a pipelined update: until the last unit landed)."""
    apply_s: float
    """vLLM's in-place layerwise reload, checks included."""
    pause_s: float
    """Engine stopped for this update: its lock wait, the apply and the checks (the fetch is not in it
    when the version was prefetched)."""
    nbytes: int
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    """Hub worker id -> bytes it served to this update's fetch."""
    transports: dict[str, str] = field(default_factory=dict)
    """Hub worker id -> transport used."""
    fetch_wait_s: float = 0.0
    """Waiting for the fetch of a version the engine needed at once (the staleness bound asked for a
    version that had just committed, so no admissible version was there to generate with meanwhile)."""
    in_flight: bool = False
    """Switched in by reference (`VllmEngine.prepare`): `apply_s` is the build beside the live weights (off
    the decode path), `pause_s` the swap."""

    @property
    def seconds(self) -> float:  # the FetchResult fields a fetch event reads
        return self.fetch_s

    def metrics(self) -> dict[str, float]:
        return {"sync/fetch_s": self.fetch_s, "sync/apply_s": self.apply_s, "sync/pause_s": self.pause_s,
                "sync/fetch_wait_s": self.fetch_wait_s,
                "sync/bytes": float(self.nbytes), "sync/version": float(self.version)}
