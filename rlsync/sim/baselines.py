"""The baselines' data movement, on the same simulated links as rlsync (no hub: they have none).

- `broadcast`: NCCL's shape as its best users run it: one pipelined (ring/chain) broadcast per
  root, every member blocked until its part ends. A chain moves the data at link rate with one
  chunk of fill per hop, which is what NCCL's ring broadcast achieves on large messages; with
  several roots (trainer replicas) the receivers are split evenly into one group per root.
- `object_store`: storage's shape: the trainer puts the shard into store nodes (striped), then every
  reader gets it from them; each stream is capped at the store's copy rate (`copy_bps`: its
  serialization and host copies, e.g. the paper's Ray object store: 40 GB in 32 s).

Trainer-only point-to-point (UCX's shape) needs no code here: it is the real hub with
`PlannerConfig(source_hosts=<the trainer's hosts>)`, as in the emulated benchmarks.
"""
from __future__ import annotations

from .engine import Engine, Flow, Transfer
from .network import Network


def broadcast(net: Network, groups: list[tuple[str, list[str]]], nbytes: float, chunk: float) -> dict[str, float]:
    """Seconds until each reader holds `nbytes` (all start at t=0); `groups`: (root, its receivers in
    chain order). The root's own part ends when its first receiver has everything."""
    eng = Engine(net)
    done: dict[str, float] = {}
    for root, group in groups:
        prev, up = root, None
        for r in group:
            t = Transfer(nbytes)

            def fin(_f, r=r, t=t):
                t.done, t.got = True, t.total
                eng._dirty = True
                done[r] = eng.now
            eng.start(Flow(net.path(prev, r), nbytes, on_done=fin, owner=t, upstream=up, lag=chunk))
            prev, up = r, t
    eng.run()
    return done


def object_store(net: Network, writer: str, stores: list[str], readers: list[str], nbytes: float,
                 copy_bps: float) -> tuple[float, dict[str, float]]:
    """(seconds until the put completes, seconds until each reader holds the bytes)."""
    eng = Engine(net)
    part = nbytes / len(stores)
    put_left = [len(stores)]
    put_done: list[float] = []
    got: dict[str, float] = {}

    def get_all() -> None:
        left = {r: len(stores) for r in readers}
        for r in readers:
            for s in stores:
                def fin(_f, r=r):
                    left[r] -= 1
                    if left[r] == 0:
                        got[r] = eng.now
                eng.start(Flow(net.path(s, r), part, on_done=fin, cap=copy_bps))

    def put_fin(_f) -> None:
        put_left[0] -= 1
        if put_left[0] == 0:
            put_done.append(eng.now)
            get_all()
    for s in stores:
        eng.start(Flow(net.path(writer, s), part, on_done=put_fin, cap=copy_bps))
    eng.run()
    return put_done[0], got

