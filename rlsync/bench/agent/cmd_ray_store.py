"""Agent commands for the Ray object-store baseline (`rlsync/bench/raybase.py` starts the Ray nodes):
the driver in the hub's agent, a trainer actor that `ray.put`s its buckets, reader actors that
`ray.get` them. Registered in the agent's command registry (the agent's `__main__` imports this module).
"""
from __future__ import annotations

import os
import time

from .protocol import STATE, command


# ---------------------------------------------------------------- inside the hub's agent (the driver)
@command("ray_driver")
def _ray_driver(address: str, hosts: list[str], mib: float, seed: int, bucket_mib: float, token: str) -> dict:
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    import ray

    ray.init(address=address, logging_level="WARNING", log_to_driver=False)

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self, mib, seed, zero, bucket_mib):
            from rlsync.hub.tools.fakes import make_model
            self.m = make_model(mib, seed, zero=zero, bucket_mib=bucket_mib)

        def mutate(self, step):
            from rlsync.hub.tools.fakes import digest
            for flat in self.m.buckets:
                flat.add_(float(step))
            return digest(self.m.tensors)

        def put(self, at):
            time.sleep(max(0.0, at - time.monotonic()))
            t0 = time.monotonic()
            ref = ray.put([b.numpy() for b in self.m.buckets])
            return [ref], t0, time.monotonic()

        def get(self, refs, at):
            import torch

            from rlsync.hub.tools.fakes import digest
            time.sleep(max(0.0, at - time.monotonic()))
            t0 = time.monotonic()
            arrays = ray.get(refs[0])
            for dst, src in zip(self.m.buckets, arrays):
                dst.copy_(torch.from_numpy(src))
            t1 = time.monotonic()
            return {"t0": t0, "t1": t1, "digest": digest(self.m.tensors)}

    actors = {h: Holder.options(resources={f"host_{h}": 0.001}).remote(mib, seed, h != "trainer", bucket_mib)
              for h in hosts}
    ray.get([a.mutate.remote(0) for a in actors.values()])
    STATE.extra["ray"] = actors
    return {"nodes": len(ray.nodes())}


@command("ray_round")
def _ray_round(readers: list[str], step: int, go: float) -> dict:
    import ray

    actors = STATE.extra["ray"]
    digest = ray.get(actors["trainer"].mutate.remote(step))
    refs, p0, p1 = ray.get(actors["trainer"].put.remote(go))
    res = ray.get([actors[h].get.remote(refs, p1) for h in readers])
    del refs
    return {"trainer_digest": digest, "put": [p0, p1], "readers": dict(zip(readers, res))}
