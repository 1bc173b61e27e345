"""The client's typed configs, apart from the client so a run's config schema imports no torch.

`rlsync.hub.ClientConfig` is here (its `dataplane` section: `rlsync.hub.dataplane.config.DataPlaneConfig`);
`python -m rlsync.train` composes and validates its config (which embeds them) before importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.model.manifest import ManifestConfig


@dataclass(kw_only=True, slots=True)
class ClientConfig:
    manifest: ManifestConfig = field(default_factory=ManifestConfig)
    """How published tensors are cut into transfer units."""
    dataplane: DataPlaneConfig = field(default_factory=DataPlaneConfig)
    """This worker's data-plane server."""
    transport: str | None = None
    """Force one transport ('tcp-py', 'shm', ...) instead of the best usable per peer."""
    rpc_timeout_s: float = 10.0
    """Deadline of one try of a control RPC (retried with backoff while the hub is unreachable)."""
    hub_deadline_s: float = 60.0
    """How long calls keep retrying an unreachable hub (restart, failover) before HubUnavailableError."""
    replan_attempts: int = 4
    """How many times one fetch asks the hub for new sources after sources died or stalled."""
    heartbeat_s: float = 1.0
    """Heartbeat period; the hub expires a worker silent for its worker_timeout_s."""
    release_timeout_s: float | None = None
    """Deadline for a release (waiting for readers to drain); None waits as long as it takes."""
