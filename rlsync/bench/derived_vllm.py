"""The vLLM engines of `bench derived` (rlsync/bench/derived.py) and its probes: apply time in parts, the int8
variant applied in place, the kernels' packed weights.

- `VllmPair`: one bf16 engine, two stages (today's fp32 reads, the bf16 variant), versions alternating; each
  update's apply in parts (`DirectPlan.parts`: the stage's checksum re-check, copies, repack per layer kind).
- `Int8Engine`: one engine started from the int8 (W8A8) checkpoint of the model directory, fed the `int8`
  variant in place by its stage (direct.py re-runs vLLM's CPU int8 kernel set-up, no layerwise reload).
- `probe_int8`: does the applied int8 variant leave the engine as a start from that version's checkpoint does?
- `probe_repack`: what a kernel-layout variant would carry (docs/derived.md).
"""
from __future__ import annotations

import json
import os
import shutil
import time

from rlsync.rollout.vllm.model_dir import fp32_weights


def int8_variant(src: dict) -> dict:
    """The `int8` transform's own bytes of `src` (rlsync/core/transforms.py)."""
    from rlsync.core.transforms import get_transform, specs_of

    t = get_transform("int8")
    q = t.allocate(t.specs(specs_of(src)))
    t.apply(src, q)
    return q


def write_int8_checkpoint(model_dir: str, out_dir: str, src: dict | None = None) -> dict:
    """`out_dir`: the int8 (W8A8) checkpoint of `src` (default: the directory's weights); the variant's tensors."""
    from rlsync.rollout.vllm.model_dir import write_variant_checkpoint

    return write_variant_checkpoint(model_dir, out_dir, "int8", src)


def _parts(engine, stage) -> dict:
    from rlsync.rollout.vllm.staging import specs_of
    from rlsync.rollout.vllm.worker_apply import direct_parts

    return engine.llm.collective_rpc(direct_parts, args=(specs_of(stage._manifest),))[0]


class VllmPair:
    """One bf16 vLLM engine, two stages: today's fp32 reads and the bf16 variant; versions alternate between them."""

    def __init__(self, hub):
        from rlsync.hub import HubClient, Location
        from rlsync.rollout.vllm.engine import VllmEngine
        from rlsync.rollout.vllm.stage import HubWeightStage

        self.engine = VllmEngine(VllmEngine.Config(max_model_len=256, max_new_tokens=8))
        self.clients, self.stages = [], {}
        for k, variant in (("fp32", None), ("bf16", "bf16")):
            c = HubClient(hub.address, token=hub.token)
            c.join(Location(host="hv"), name=f"vllm-{k}")
            self.clients.append(c)
            self.stages[k] = HubWeightStage(c, self.engine, config=HubWeightStage.Config(variant=variant))

    def update(self, version: int, path: str) -> dict:
        s = self.stages[path].update(version)
        return {"path": path, "apply_s": s.apply_s, "fetch_s": s.fetch_s, "bytes": s.nbytes,
                "parts": _parts(self.engine, self.stages[path])}

    def close(self) -> None:
        self.engine.shutdown()
        for c in self.clients:
            c.leave()


class Int8Engine:
    """A vLLM engine started from the int8 checkpoint of `model_dir`, fed `policy@int8` by its stage."""

    def __init__(self, hub, model_dir: str, ckpt_dir: str):
        from rlsync.hub import HubClient, Location
        from rlsync.rollout.vllm.engine import VllmEngine
        from rlsync.rollout.vllm.stage import HubWeightStage

        write_int8_checkpoint(model_dir, ckpt_dir)
        self.ckpt_dir = ckpt_dir
        self.engine = VllmEngine(VllmEngine.Config(model_dir=ckpt_dir, max_model_len=256, max_new_tokens=8))
        self.client = HubClient(hub.address, token=hub.token)
        self.client.join(Location(host="hq"), name="vllm-int8")
        self.stage = HubWeightStage(self.client, self.engine, config=HubWeightStage.Config(variant="int8"))

    def update(self, version: int) -> dict:
        s = self.stage.update(version)
        return {"path": "int8", "apply_s": s.apply_s, "fetch_s": s.fetch_s, "bytes": s.nbytes,
                "parts": _parts(self.engine, self.stage)}

    def close(self) -> None:
        self.engine.shutdown()
        self.client.leave()
        shutil.rmtree(self.ckpt_dir, ignore_errors=True)


def probe_int8(model_dir: str, out_dir: str) -> dict:
    """Can this vLLM serve the `int8` variant, and take it in place? Writes the int8 variant of a version B (the
    directory's weights, perturbed) as a W8A8 checkpoint and starts an engine from it (greedy tokens and
    log-probs R_B); then applies by the direct apply B's own bytes (must leave R_B), version A's (the
    directory's: must differ), B's again from fused staging (must give R_B: the engine started from B's
    checkpoint), and finally vLLM's layerwise reload of B's bytes (what it leaves). The error text if not."""
    import torch

    from rlsync.rollout.vllm.staging import fused_buffers
    from rlsync.hub import dtype_name

    a = fp32_weights(model_dir)
    g = torch.Generator().manual_seed(33)
    b = {n: t * (1 + 0.01 * torch.randn(t.shape, generator=g)) for n, t in a.items()}
    qa = int8_variant(a)
    out: dict = {"bytes": sum(x.nbytes for x in qa.values())}
    t0 = time.monotonic()
    try:
        from vllm import SamplingParams

        from rlsync.rollout.vllm.engine import VllmEngine
        from rlsync.rollout.vllm.worker_apply import direct_parts, layerwise_reload

        qb = write_int8_checkpoint(model_dir, out_dir, b)
        eng = VllmEngine(VllmEngine.Config(model_dir=out_dir, max_model_len=256))
        out |= {"serves": True, "load_s": time.monotonic() - t0}
        tok = eng.llm.get_tokenizer()
        prompts = ["What is 3 + 4? Answer:", "Name a color.", "The capital of France is"]
        sp = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
        specs = tuple((n, tuple(t.shape)) for n, t in qb.items())

        def greedy():
            res = eng.llm.generate([{"prompt_token_ids": tok.encode(p)} for p in prompts], sp, use_tqdm=False)
            return [(o.outputs[0].token_ids, [next(iter(x.values())).logprob for x in o.outputs[0].logprobs])
                    for o in res]

        def fused(q):
            st = fused_buffers({n: (tuple(t.shape), dtype_name(t.dtype)) for n, t in q.items()})
            for n, t in q.items():
                st[n].copy_(t)
            return st

        ref = greedy()
        out["greedy_started_from_B"] = tok.decode(ref[0][0])
        steps = {}
        for label, q, v in (("same_bytes_B", qb, 1), ("version_A", qa, 2), ("B_from_fused_staging", fused(qb), 3)):
            s = eng.apply(iter(q.items()), v, specs=specs, expect=list(q))
            got = greedy()
            steps[label] = {"apply_s": s, "equal_to_started_from_B": got == ref,
                            "greedy": tok.decode(got[0][0]),
                            "logprobs_finite": all(x == x for _, lps in got for x in lps),
                            "parts": eng.llm.collective_rpc(direct_parts, args=(specs,))[0]}
        t1 = time.monotonic()
        seen = eng.llm.collective_rpc(layerwise_reload, args=(iter(qb.items()),))[0]
        got = greedy()
        steps["layerwise_reload_B"] = {"s": time.monotonic() - t1, "consumed": len(seen), "tensors": len(qb),
                                       "greedy": tok.decode(got[0][0]), "equal_to_started_from_B": got == ref,
                                       "logprobs_finite": all(x == x for _, lps in got for x in lps)}
        out["steps"] = steps
        eng.shutdown()
        return out
    except Exception as e:  # noqa: BLE001 - the probe's answer is the error text
        return out | {"serves": out.get("serves", False), "error": f"{type(e).__name__}: {e}"[:2000]}


def probe_repack() -> dict:
    """What a kernel-layout variant would have to carry: the CPU backend's packed GEMM weight for SmolLM2's 120
    linear layers (oneDNN here without AMX; sgl's packed tensor with AMX), and the seconds one repack takes."""
    import torch
    import vllm._custom_ops as ops

    shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30  # qkv, o, gate_up, down per layer
    ws = [torch.randn(s, dtype=torch.bfloat16) for s in shapes]
    t0 = time.perf_counter()
    hs = [ops.create_onednn_mm(w.t(), 32) for w in ws]
    return {"amx_tile": bool(torch.cpu._is_amx_tile_supported()), "layers": len(ws),
            "repack_s": time.perf_counter() - t0, "threads": torch.get_num_threads(),
            "onednn_handler_attrs": sorted(a for a in dir(hs[0]) if not a.startswith("__"))}
