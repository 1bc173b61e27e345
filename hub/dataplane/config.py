"""The data plane's typed config (torch-free: the run's config schema embeds it).

`ClientConfig.dataplane` (hub/client/config.py) is one of these: each client's data-plane server.
"""
from __future__ import annotations

from dataclasses import dataclass


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
    None: the count this host's calibration measured fastest for the peer's class, 2 without one
    (rlsync.hub.dataplane.tuning: a fetch reads a calibration, never runs one)."""
    zero_copy_send: bool | None = None
    """Ask `tcp` sources to splice their pages into the socket (True) or copy them (False).
    None: the mode this host's calibration measured faster (which one wins differs between machines),
    zero-copy without one."""
    register_wait_s: float = 5.0
    """How long a request with a valid ticket waits for a relay the hub advertised but this worker has
    not registered yet (it is still receiving its own plan)."""
    share_slots: int = 1
    """Units this server sends at once for tenants' reads (reads on a hub with tenants): the slots
    weighted fair queuing hands out by tenant weight (hub/dataplane/shares.py). More slots: more
    parallel streams, coarser shares."""
    serve_delay_s: float = 0.0
    """Fault injection for tests: sleep before sending each unit (a slow source). Keep 0."""
