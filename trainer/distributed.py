"""Joining the trainer's process group (gloo on CPU), from arguments or from torchrun's environment.

    init_process_group(DistConfig(world_size=2, rank=r, master_port=p))   # or DistConfig(from_env=True)

Simplifies: one default process group per process; calling again with a group already up is a no-op
(so a backend can be built twice in one process, as tests do). An elastic group re-forms by
`leave_process_group()` then `init_process_group` at the new size on a new port: gloo groups cannot shrink.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class DistConfig:
    world_size: int = 1
    """Number of trainer ranks (data-parallel degree)."""
    rank: int = 0
    """This process's rank in [0, world_size)."""
    local_rank: int = 0
    """Rank on this host (DeepSpeed reads it)."""
    master_addr: str = "127.0.0.1"
    """Address of rank 0's rendezvous store; loopback unless ranks span hosts."""
    master_port: int = 29500
    """Port of rank 0's rendezvous store (pick a free one: `free_port()`)."""
    backend: str = "gloo"
    """torch.distributed backend; gloo is the one that works on CPU."""
    from_env: bool = False
    """Read RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT from the environment (torchrun, Ray)."""
    timeout_s: float | None = None
    """Deadline of one collective (and of the rendezvous); None: torch's default (30 min for gloo).
    An elastic group sets it short, so a rank blocked on a dead peer fails instead of hanging."""

    def resolved(self) -> "DistConfig":
        if not self.from_env:
            return self
        env = os.environ
        return DistConfig(world_size=int(env["WORLD_SIZE"]), rank=int(env["RANK"]),
                          local_rank=int(env.get("LOCAL_RANK", 0)), master_addr=env["MASTER_ADDR"],
                          master_port=int(env["MASTER_PORT"]), backend=self.backend, timeout_s=self.timeout_s)


def export_env(cfg: DistConfig) -> None:
    """Write the rendezvous variables that torch and DeepSpeed read from the environment."""
    os.environ.update(RANK=str(cfg.rank), WORLD_SIZE=str(cfg.world_size), LOCAL_RANK=str(cfg.local_rank),
                      MASTER_ADDR=cfg.master_addr, MASTER_PORT=str(cfg.master_port))


def init_process_group(cfg: DistConfig) -> DistConfig:
    """Join the default process group described by `cfg` (no-op if one is already up); returns it resolved."""
    cfg = cfg.resolved()
    if dist.is_initialized():
        if dist.get_world_size() != cfg.world_size:
            raise RuntimeError(f"a process group of size {dist.get_world_size()} is already up; "
                               f"cannot join one of size {cfg.world_size}")
        return cfg
    export_env(cfg)
    log.info("joining %s process group: rank %d/%d via %s:%d", cfg.backend, cfg.rank, cfg.world_size,
             cfg.master_addr, cfg.master_port)
    kw = {"timeout": timedelta(seconds=cfg.timeout_s)} if cfg.timeout_s else {}
    dist.init_process_group(cfg.backend, rank=cfg.rank, world_size=cfg.world_size, **kw)
    return cfg


def leave_process_group() -> None:
    """Tear down this process's default group (if any), e.g. after a peer died, before re-forming."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001 - a group whose peer died may fail to shut down cleanly
            log.warning("destroying the process group: %s", e)


def free_port() -> int:
    """A TCP port free on loopback right now (racy by nature; fine for tests and single hosts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
