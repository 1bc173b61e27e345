"""A variant in fused staging is packed straight from there (rollout/vllm/direct.py, docs/derived.md).

No vLLM here: the pieces that decide it. The engine-level check (greedy tokens and log-probs equal to
today's fp32 path, the staging refilled under a running engine) is
tests/vllm/test_vllm_engine.py::test_bf16_variant_applies_as_the_fp32_path_with_half_the_bytes.
"""
import torch

from rlsync.hub import dtype_name
from rlsync.rollout.vllm.direct import _refers_to, _whole
from rlsync.rollout.vllm.staging import fused_buffers

SPECS = {"model.layers.0.self_attn.q_proj.weight": ((8, 4), torch.bfloat16),
         "model.layers.0.self_attn.k_proj.weight": ((2, 4), torch.bfloat16),
         "model.layers.0.self_attn.v_proj.weight": ((2, 4), torch.bfloat16),
         "model.layers.0.self_attn.o_proj.weight": ((4, 8), torch.bfloat16),
         "model.norm.weight": ((4,), torch.bfloat16)}
QKV = [f"model.layers.0.self_attn.{x}_proj.weight" for x in "qkv"]


def _parts(staging):
    return [(slice(r0, r0 + staging[n].shape[0]), staging[n]) for n, r0 in zip(QKV, (0, 8, 10))]


def test_fused_staging_parts_are_the_layers_weight_without_a_copy():
    st = fused_buffers({n: (s, dtype_name(dt)) for n, (s, dt) in SPECS.items()})
    for i, n in enumerate(QKV):
        st[n].fill_(i + 1)
    buf = torch.zeros((12, 4), dtype=torch.bfloat16)  # the engine's qkv_proj buffer
    w = _whole(buf, _parts(st))
    assert w is not None and w.data_ptr() == st[QKV[0]].data_ptr() and tuple(w.shape) == (12, 4)
    assert torch.equal(w, torch.cat([st[n] for n in QKV])) and not buf.any()  # nothing was copied
    assert _whole(torch.zeros((4, 8), dtype=torch.bfloat16), [(None, st["model.layers.0.self_attn.o_proj.weight"])]) \
        is not None


def test_staging_that_is_not_the_weight_is_copied():
    st = fused_buffers({n: (s, dtype_name(dt)) for n, (s, dt) in SPECS.items()})
    buf = torch.zeros((12, 4), dtype=torch.bfloat16)
    assert _whole(buf, _parts(st)[:2]) is None                       # a part missing
    assert _whole(buf.float(), _parts(st)) is None                    # another dtype: the converting copy (fp32 path)
    apart = {n: torch.zeros(SPECS[n][0], dtype=torch.bfloat16) for n in QKV}  # the hub's own allocation: apart
    assert _whole(buf, _parts(apart)) is None
    swapped = _parts(st)
    swapped[0], swapped[1] = (swapped[0][0], swapped[1][1]), (swapped[1][0], swapped[0][1])
    assert _whole(buf, swapped) is None                               # rows out of their places


def test_a_kernel_keeping_its_source_is_seen():
    """oneDNN's handler packs its own copy (checked on this CPU: the output does not follow the source); a
    kernel closing over the source (the torch fallback, zentorch without prepacking) must not be packed from
    staging that the next prefetch refills."""
    src = torch.zeros((12, 4), dtype=torch.bfloat16)

    class Handler:  # what oneDNN's closure holds: an opaque handle
        n, k = 12, 4

    own, keeps = torch.nn.Linear(4, 12), torch.nn.Linear(4, 12)
    h, view = Handler(), src[2:5]
    own.cpu_linear = lambda x, weight, bias: (h, x)
    keeps.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, view, bias)
    assert not _refers_to(own, src) and _refers_to(keeps, src)
    own.weight = torch.nn.Parameter(src, requires_grad=False)  # a weight left pointing at it
    assert _refers_to(own, src)
