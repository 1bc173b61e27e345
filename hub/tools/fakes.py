"""Fake models and their digest: what the hub's tools, its tests and the benchmarks publish and compare.

    m = make_model(64, seed=1)                    # 4 big matrices + 16 tiny norms, each its own tensor
    b = make_model(64, seed=1, bucket_mib=16.0)   # 8 layers laid out in flat buckets (the benchmarks')
    digest(m.tensors) == digest(fetched)          # equal iff bit-for-bit equal (names, dtypes, shapes, bytes)

Two layouts, because the callers rely on each one's bytes: the hub's tests and the chaos/soak benchmarks
recompute `make_model(size, seed=v)` to check a fetch of v, and their unit counts come from its shapes;
the agent benchmarks keep parameters in flat buckets (how DeepSpeed/Megatron hold them), so every
system they compare reads and writes the very same memory. The RL side has its own digest
(`rlsync.core.digest`, sha256): the hub imports nothing of it, and the two are never compared.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import xxhash


@dataclass
class FakeModel:
    tensors: dict[str, torch.Tensor]
    """Name -> tensor; in the bucketed layout, contiguous views into `buckets`."""
    buckets: list[torch.Tensor]
    """The memory the tensors live in: one flat tensor per bucket (or each tensor, unbucketed)."""


def make_model(mib: float, seed: int, *, bucket_mib: float | None = None, zero: bool = False) -> FakeModel:
    """A deterministic fake float32 model of about `mib` MiB.

    `bucket_mib=None`: 4 big matrices + 16 norms of 64 floats (tiny tensors, which the manifest
    packs together), each drawn in turn from one generator. `bucket_mib=x`: 8 layers (a big weight,
    a 256-float norm and bias each) in flat buckets of about x MiB, each bucket drawn whole (`zero`:
    left zero, pages touched)."""
    g = torch.Generator().manual_seed(seed)
    if bucket_mib is None:
        elems = max(1, int(mib * (1 << 20) / 4 / 4))
        tensors = {f"layer{i}.weight": torch.randn(elems, generator=g) for i in range(4)}
        tensors.update({f"layer{i}.norm": torch.randn(64, generator=g) for i in range(16)})
        if zero:
            for t in tensors.values():
                t.zero_()
        return FakeModel(tensors, list(tensors.values()))
    return _bucketed(mib, g, 8, bucket_mib, zero)


def _bucketed(mib: float, g: torch.Generator, n_layers: int, bucket_mib: float, zero: bool) -> FakeModel:
    big = max(1, int(mib * (1 << 20) / 4 / n_layers) - 2 * 256)
    shapes = []
    for i in range(n_layers):
        shapes += [(f"layers.{i}.weight", big), (f"layers.{i}.norm", 256), (f"layers.{i}.bias", 256)]
    cap = max(1, int(bucket_mib * (1 << 20) / 4))
    specs, cur, acc = [], [], 0
    for name, n in shapes:
        if cur and acc + n > cap:
            specs.append(cur)
            cur, acc = [], 0
        cur.append((name, n))
        acc += n
    specs.append(cur)
    tensors, buckets = {}, []
    for spec in specs:
        flat = torch.zeros(sum(n for _, n in spec), dtype=torch.float32)  # zeros: pages touched
        if not zero:
            flat.normal_(generator=g)
        off = 0
        for name, n in spec:
            tensors[name] = flat[off:off + n]
            off += n
        buckets.append(flat)
    return FakeModel(tensors, buckets)


def digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """xxh3-128 over the tensors' names, dtypes, shapes and bytes, in name order: equal iff
    bit-for-bit equal (a bf16 and an fp16 tensor of the same bits differ; so do [4, 2] and [8])."""
    h = xxhash.xxh3_128()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # no copy; any dtype (bf16 has no numpy twin)
    return h.hexdigest()
