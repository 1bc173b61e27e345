"""The shapes users run today, each as its best practitioners would run it (bucketed, warm).

- gloo broadcast from the trainer — NCCL's shape (one static group, every member in the call).
  The model lives in flat buckets (as DeepSpeed/Megatron keep it); the trainer broadcasts every
  bucket straight from its parameter memory into the readers' parameter memory, all buckets issued
  asynchronously so gloo can overlap them, after an untimed warm-up broadcast. No copies anywhere.
- trainer-only point-to-point — UCX's shape: every reader pulls the whole model from the trainer.
  It runs on rlsync's own data plane (same native TCP engine, same streams, same verification),
  with a hub whose planner may only pick sources on the trainer's host
  (`PlannerConfig.source_hosts`):
  the only difference from rlsync is who serves, which is what the comparison is about.
- Ray's object store — storage's shape: `rlsync.bench.raybase` (a Ray node per namespace; its agent
  commands in `cmd_ray_store.py`).

Functions decorated with `@command` run inside an agent process (`python -m rlsync.bench.agent`).
"""
from __future__ import annotations

import os
import time

from .protocol import STATE, command


# ---------------------------------------------------------------- gloo broadcast (NCCL's shape)
@command("gloo_init")
def _gloo_init(master: str, port: int, rank: int, world: int, groups: dict[str, list[int]],
               ifname: str = "eth0", timeout_s: float = 300.0) -> dict:
    """Join the static gloo group (over this namespace's eth0) and build the sub-groups, in order."""
    from datetime import timedelta

    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    t0 = time.monotonic()
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    made = {}
    for key in sorted(groups):  # every rank creates every group in the same order
        made[key] = dist.new_group(ranks=groups[key])
    STATE.extra["gloo"] = {k: g for k, g in made.items() if rank in groups[k]}
    return {"seconds": time.monotonic() - t0}


@command("gloo_bcast")
def _gloo_bcast(buf: str, group: str, src: int = 0) -> dict:
    import torch.distributed as dist

    from rlsync.hub.tools.fakes import digest

    g = STATE.extra["gloo"][group]
    t0 = time.monotonic()
    works = [dist.broadcast(flat, src=src, group=g, async_op=True) for flat in STATE.models[buf].buckets]
    for w in works:
        w.wait()
    t1 = time.monotonic()
    return {"t0": t0, "t1": t1, "digest": digest(STATE.models[buf].tensors)}


@command("gloo_close")
def _gloo_close() -> bool:
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return True
