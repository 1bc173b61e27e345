"""The client's typed configs, apart from the client so a run's config schema imports no torch.

`rlsync.hub.ClientConfig` and `rlsync.hub.dataplane.DataPlaneConfig` are these (re-exported);
`python -m rlsync.train` composes and validates its config (which embeds them) before importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .manifest import ManifestConfig


@dataclass(kw_only=True, slots=True)
class DataPlaneConfig:
    host: str = "127.0.0.1"
    """Address the data-plane server binds; loopback unless the deployment spans hosts."""
    io_timeout_s: float = 30.0
    """A peer silent this long on an open data connection is treated as dead."""
    relay_wait_s: float = 120.0
    """How long a relay's server waits for a unit it has not received yet."""
    streams: int | None = None
    """Parallel connections per source a reader opens, units striped over them (capped by the
    transport's `max_streams`: 1 for tcp-py, whose per-unit verification holds the GIL).
    None: the count measured fastest on this host for the peer's class (rlsync.hub.dataplane_tuning)."""
    zero_copy_send: bool | None = None
    """Ask `tcp` sources to splice their pages into the socket (True) or copy them (False).
    None: the mode measured faster on this host (which one wins differs between machines)."""
    register_wait_s: float = 5.0
    """How long a request with a valid ticket waits for a relay the hub advertised but this worker has
    not registered yet (it is still receiving its own plan)."""
    serve_delay_s: float = 0.0
    """Fault injection for tests: sleep before sending each unit (a slow source). Keep 0."""


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
