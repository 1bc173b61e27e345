"""Agent commands for the delta benchmarks (`crossdc --delta`, `elastic --delta`): a bf16 model, a
real-like optimizer step, publish_delta and fetch_delta. Registered in the agent's command registry
(the agent's `__main__` imports this module).

The real-like step is calibrated on SmolLM2-135M (docs/deltas.md): after an AdamW step at the
grpo_real recipe's lr, 3.5-8% of the bf16 weights change (4 steps), mostly by one unit in the last place.
`mutate_real` moves a seeded `frac` of the elements by one ulp up or down, so its deltas encode to
about the size the real updates do (the benchmark reports the ratio it got).
"""
from __future__ import annotations

import time

from .protocol import STATE, command, join_hub


@command("model_bf16")
def _model_bf16(buf: str, mib: float, seed: int = 0, zero: bool = False, bucket_mib: float = 16.0) -> dict:
    """A bf16 model of `mib` MiB laid out like `model` (flat buckets, per-tensor views)."""
    import torch

    from rlsync.hub.tools.fakes import FakeModel, digest, make_model

    m = make_model(mib * 2, seed, zero=zero, bucket_mib=bucket_mib * 2)  # fp32 of twice the bytes ...
    buckets, tensors = [], {}
    for flat in m.buckets:
        b = flat.to(torch.bfloat16)                                        # ... cast: the same elements
        buckets.append(b)
        base = flat.data_ptr()
        for name, t in m.tensors.items():
            if flat.data_ptr() <= t.data_ptr() < flat.data_ptr() + flat.numel() * 4:
                off = (t.data_ptr() - base) // 4
                tensors[name] = b[off:off + t.numel()]
    STATE.models[buf] = FakeModel(tensors, buckets)
    return {"nbytes": sum(b.numel() * 2 for b in buckets), "digest": digest(tensors)}


@command("mutate_real")
def _mutate_real(buf: str, step: int, frac: float = 0.05) -> dict:
    """A real-like optimizer step on a bf16 model: `frac` of the elements move by +-1 ulp (seeded)."""
    import torch

    from rlsync.hub.tools.fakes import digest

    g = torch.Generator().manual_seed(1000 + step)
    for flat in STATE.models[buf].buckets:
        bits = flat.view(torch.int16)
        mask = torch.rand(flat.numel(), generator=g) < frac
        sign = torch.randint(0, 2, (int(mask.sum()),), generator=g, dtype=torch.int16) * 2 - 1
        bits[mask] += sign
    return {"digest": digest(STATE.models[buf].tensors)}


@command("publish_delta")
def _publish_delta(client: str, model: str, version: int, buf: str, delta_first: bool = False) -> dict:
    """Publish v and its delta; t1: v committed. `delta_first`: the delta before v (rlsync.workers'
    order: whoever sees v finds its delta; t0..t1 then includes the encode), else after (t1..t2)."""
    c = STATE.clients[client]
    t0 = time.monotonic()
    info = c.publish_delta(model, version, STATE.models[buf].tensors) if delta_first else {}
    committed = c.publish(model, version, STATE.models[buf].tensors)
    t1 = time.monotonic()
    info = info or c.publish_delta(model, version, STATE.models[buf].tensors)
    return {"committed": committed, "t0": t0, "t1": t1, "t2": time.monotonic(), **info}


@command("fetch_delta")
def _fetch_delta(client: str, model: str, buf: str, version: int | str = "latest") -> dict:
    from rlsync.hub.tools.fakes import digest
    c = STATE.clients[client]
    t0 = time.monotonic()
    r = c.fetch_delta(model, version, into=STATE.models[buf].tensors)
    t1 = time.monotonic()
    return {"t0": t0, "t1": t1, "version": r.version, "mode": r.mode, "nbytes": r.nbytes, "phases": r.phases,
            "bytes_by_source": r.bytes_by_source, "digest": digest(STATE.models[buf].tensors)}


@command("join_and_fetch_delta")
def _join_and_fetch_delta(join: dict, fetch: dict) -> dict:
    t0 = time.monotonic()
    if fetch["client"] not in STATE.clients:
        join_hub(**join)
    r = _fetch_delta(**fetch)
    r["t0"] = t0
    return r
