"""What every worker process of a run starts with: its set-up, how it reaches the hub, where it is.

    setup = ProcessSetup(plugins=("my_task",), run_dir="/runs/r1")   # the driver builds these once
    hub = HubAccess(address="127.0.0.1:7000", token="...", model="policy")
    process_setup(setup, "main-0")                                  # first thing in an actor's __init__
    client = hub_client(hub, LocationConfig(dc="dc1"), "main-0")    # a joined `HubClient`

An actor is built from its own config sections plus these two (never the whole run config), so this
file imports no Ray: the run's schema (rlsync/config/) embeds `LocationConfig` without starting anything.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

import torch

from rlsync.hub import ClientConfig
from rlsync.hub.logs import quiet_console, setup_logging

log = logging.getLogger(__name__)

CHATTER = ("rlsync.hub", "rlsync.pool", "rlsync.workers")
"""Loggers whose INFO lines are per-version chatter (commits, offload-seeds, dropped seeds, joins, re-joins):
they go to the run's log files (`<run dir>/train.log`, `<run dir>/logs/<worker>.log`), not the console."""

WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
              # DeepSpeed's compiled op is cached here, one directory per venv (scripts/run's default too):
              # never rebuilt per run, nor by another checkout's venv.
              "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                     os.path.join(sys.prefix, "torch_extensions"))}


@dataclass(kw_only=True)
class LocationConfig:
    """Topology labels a worker joins the hub with (the planner prefers near sources)."""

    dc: str = "dc0"
    """Datacenter label."""
    rack: str = "rack0"
    """Rack label inside the DC."""
    host: str = ""
    """Host label; empty: the machine's hostname."""


@dataclass(frozen=True, kw_only=True)
class HubAccess:
    """How a worker reaches the run's hub (the run's `hub` section narrowed to what a worker uses)."""

    address: str
    """The embedded hub's control-plane address (host:port)."""
    token: str
    """The hub's shared credential."""
    client: ClientConfig = field(default_factory=ClientConfig)
    """Every worker's `ClientConfig` (`hub.client`)."""
    model: str = "policy"
    """The policy's model name in the hub (`hub.model_name`)."""


@dataclass(frozen=True, kw_only=True)
class ProcessSetup:
    """What a worker process does before it builds anything (from the run's top level and `ray` section)."""

    plugins: tuple[str, ...] = ()
    """The user's modules to import (their registrations), as the driver did."""
    plugin_path: tuple[str, ...] = ()
    """Directories put first on sys.path before importing `plugins` (absolute)."""
    run_dir: str | None = None
    """The run's directory: this worker's chatter goes to `<run dir>/logs/<name>.log` (None: the console)."""
    torch_threads: int = 1
    """Intra-op threads of this process."""
    deterministic: bool = False
    """The run's `deterministic`: torch's deterministic kernels only (an op without one raises)."""


def process_setup(setup: ProcessSetup, name: str = "") -> None:
    """What every worker process does first: environment, logging (chatter to `<run dir>/logs/<name>.log`,
    not the driver's console), the user's plugins, intra-op threads."""
    from rlsync.core.plugins import load_plugins

    os.environ.update(WORKER_ENV)
    setup_logging()
    load_plugins(list(setup.plugins), list(setup.plugin_path))  # the user's registrations, before anything is built
    if not getattr(process_setup, "_done", False):
        process_setup._done = True
        log_file = os.path.join(setup.run_dir, "logs", f"{name or os.getpid()}.log") if setup.run_dir else None
        quiet_console(CHATTER, log_file)
    torch.set_num_threads(max(1, setup.torch_threads))
    if setup.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS needs on a GPU
        torch.use_deterministic_algorithms(True)


def hub_client(hub: HubAccess, location: LocationConfig, name: str, *, on_fetch=None, **join):
    """A `HubClient` of the run's hub, joined at `location` as `name`."""
    from rlsync.hub import HubClient, Location

    client = HubClient(hub.address, token=hub.token, config=hub.client, on_fetch=on_fetch)
    client.join(Location(dc=location.dc, rack=location.rack, host=location.host), name=name, **join)
    return client


def with_telemetry(cls):
    """Give a worker class the `drain_stall` method every worker exposes."""

    def drain_stall(self) -> list:
        """Closed state intervals and events since the last drain (the open interval is cut at now)."""
        return self.clock.drain()

    def peak_rss_mb(self) -> float:
        """This process's peak resident set size (MiB; Linux reports ru_maxrss in KiB)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    cls.drain_stall = drain_stall
    cls.peak_rss_mb = peak_rss_mb
    return cls
