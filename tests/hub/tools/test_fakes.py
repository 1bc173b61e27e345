"""The one fake model and digest the hub's tools, its tests and the benchmarks share (hub/tools/fakes.py):
the digest tells apart what a bytes-only hash would not (dtype, shape, name), and each layout is
deterministic in its seed, in the shapes its callers count on."""
from __future__ import annotations

import torch

from rlsync.hub.tools.fakes import digest, make_model


def test_digest_is_equal_iff_names_dtypes_shapes_and_bytes_are():
    x = torch.arange(8, dtype=torch.float32)
    base = digest({"w": x})
    assert digest({"w": x.clone()}) == base
    assert digest({"w": x.reshape(4, 2)}) != base                       # same bytes, another shape
    assert digest({"w": x.view(torch.int32)}) != base                   # same bytes, another dtype
    h = torch.ones(4, dtype=torch.float16)
    assert digest({"w": h}) != digest({"w": h.view(torch.bfloat16)})    # the same bits, two 16-bit dtypes
    assert digest({"v": x}) != base                                     # another name
    assert digest({"a": x[:4], "b": x[4:]}) == digest({"b": x[4:].clone(), "a": x[:4].clone()})  # name order
    assert digest({"e": torch.empty(0)}) != digest({"e": torch.empty(0, 3)})


def test_the_unbucketed_model_is_deterministic_with_tiny_tensors_for_compaction():
    a, b = make_model(1, seed=3), make_model(1, seed=3)
    assert digest(a.tensors) == digest(b.tensors) != digest(make_model(1, seed=4).tensors)
    assert sorted(a.tensors) == sorted([f"layer{i}.weight" for i in range(4)] + [f"layer{i}.norm" for i in range(16)])
    assert a.tensors["layer0.weight"].numel() == (1 << 20) // 16 and a.tensors["layer5.norm"].numel() == 64
    assert a.buckets == list(a.tensors.values())


def test_the_bucketed_model_is_views_into_flat_buckets():
    m = make_model(4, seed=0, bucket_mib=1.0)
    assert len(m.tensors) == 24 and len(m.buckets) == 4
    assert sum(b.numel() for b in m.buckets) == sum(t.numel() for t in m.tensors.values())
    before = digest(m.tensors)
    m.buckets[0].add_(1.0)                       # a step on the buckets is a step on the named tensors
    assert digest(m.tensors) != before
    assert digest(make_model(4, seed=0, bucket_mib=1.0).tensors) == before
    z = make_model(4, seed=0, bucket_mib=1.0, zero=True)
    assert all(not b.any() for b in z.buckets)
