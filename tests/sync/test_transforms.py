"""Transforms (rlsync/core/transforms.py): registered, and deterministic across processes.

A fresh interpreter on one torch thread derives the same variants from the same bytes as this process (its
default threads) and must produce the same digests: the variant a worker derives is the one every worker derives.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from rlsync.core.digest import weights_digest
from rlsync.core.registry import UnknownNameError
from rlsync.core.transforms import get_transform, specs_of, transform_names

CHILD = r"""
import json, sys, torch
torch.set_num_threads(int(sys.argv[2]))
from rlsync.core.digest import weights_digest
from rlsync.core.transforms import get_transform, specs_of
src = torch.load(sys.argv[1])
out = {}
for name in ("bf16", "int8"):
    t = get_transform(name)
    buf = t.allocate(t.specs(specs_of(src)))
    t.apply(src, buf)
    out[name] = weights_digest(buf)
print(json.dumps(out))
"""


def _weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"model.embed_tokens.weight": torch.randn(300, 64, generator=g),
            "model.layers.0.self_attn.q_proj.weight": torch.randn(257, 64, generator=g) * 0.02,
            "model.layers.0.mlp.down_proj.weight": torch.randn(64, 1031, generator=g) * 3,
            "model.norm.weight": torch.rand(64, generator=g),
            "step": torch.arange(3)}


def test_registry_names_and_refusal():
    assert {"bf16", "int8"} <= set(transform_names())
    with pytest.raises(UnknownNameError, match="known: .*bf16"):
        get_transform("fp4")


def test_bf16_halves_floats_and_keeps_ints():
    src = _weights()
    t = get_transform("bf16")
    out = t.allocate(t.specs(specs_of(src)))
    t.apply(src, out)
    assert out["model.norm.weight"].dtype == torch.bfloat16 and out["step"].dtype == torch.int64
    assert torch.equal(out["model.embed_tokens.weight"], src["model.embed_tokens.weight"].to(torch.bfloat16))


def test_int8_per_row_scale_round_trips_within_half_a_step():
    src = _weights()
    t = get_transform("int8")
    out = t.allocate(t.specs(specs_of(src)))
    t.apply(src, out)
    w = src["model.layers.0.mlp.down_proj.weight"]
    q, s = out["model.layers.0.mlp.down_proj.weight"], out["model.layers.0.mlp.down_proj.weight_scale"]
    assert q.dtype == torch.int8 and s.shape == (64, 1) and q.abs().max() == 127
    assert ((q.float() * s - w).abs() <= s / 2 + 1e-6).all()
    assert out["model.embed_tokens.weight"].dtype == torch.bfloat16  # not a `*proj.weight`: cast only


def test_apply_refuses_buffers_of_another_layout():
    src = _weights()
    t = get_transform("bf16")
    out = t.allocate(t.specs(specs_of(src)))
    out["model.norm.weight"] = torch.empty(64, dtype=torch.float32)
    with pytest.raises(ValueError, match="model.norm.weight"):
        t.apply(src, out)


def test_same_bytes_in_two_processes(tmp_path):
    src = _weights(7)
    path = tmp_path / "w.pt"
    torch.save(src, path)
    mine = {}
    for name in ("bf16", "int8"):
        t = get_transform(name)
        buf = t.allocate(t.specs(specs_of(src)))
        t.apply(src, buf)
        mine[name] = weights_digest(buf)
    env = dict(os.environ)
    got = json.loads(subprocess.run([sys.executable, "-c", CHILD, str(path), "1"], env=env, check=True,
                                    capture_output=True, text=True, timeout=120).stdout.strip().splitlines()[-1])
    assert got == mine
