"""What runs inside a vLLM worker to write a version into its model in place: the direct apply (a plan
per layout, `direct.py`), vLLM's layerwise reload (with the tied-head re-pack), and the caches a reload
resets. `engine.py` sends these as collective_rpc callables (TP = 1); `tp.py`'s worker extension and
`transfer_backend.py` call them in the worker directly. This module imports neither of them back.
"""
from __future__ import annotations

import logging
from typing import Iterable

import torch

log = logging.getLogger(__name__)


class _DropDtypeNotes(logging.Filter):
    """vLLM warns once per tensor when fp32 trainer weights load into bf16 parameters: expected here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Attempted to load weight")


def quiet_dtype_notes() -> None:
    """Drop vLLM's per-tensor note on loading fp32 weights into bf16 parameters (expected: the trainer is fp32)."""
    lg = logging.getLogger("vllm.model_executor.models.utils")
    if not any(isinstance(f, _DropDtypeNotes) for f in lg.filters):
        lg.addFilter(_DropDtypeNotes())


def layerwise_load(model, model_config, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """vLLM's in-place layerwise reload of `model` from checkpoint-format `weights` (what
    `reload_weights(is_checkpoint_format=True)` does); returns the names consumed. Runs where the
    model lives (inside the worker)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    seen: set[str] = set()

    def names(it):
        for name, t in it:
            seen.add(name)
            yield name, t

    with torch.no_grad():
        initialize_layerwise_reload(model)
        model.load_weights(names(weights))
        finalize_layerwise_reload(model, model_config)
        for m in tied_heads(model):
            m.quant_method.process_weights_after_loading(m)
    return seen


def tied_heads(model) -> list:
    """Modules with a quant method holding a parameter another module owns too (a tied `lm_head`).

    vLLM's layerwise reload loads the embedding, but finds no checkpoint tensor for the head and puts
    its old kernel tensors back: on the CPU backend the head's GEMM keeps its packed copy of the old
    embedding (measured: a version that changes only the embedding left vLLM's log-probs 24.6 nats
    per token away from the trainer's; after re-packing the head, 0.015). Re-processing them fixes it.
    """
    owner: dict[int, str] = {}
    for path, m in model.named_modules():
        for p in m._parameters.values():
            if p is not None:
                owner.setdefault(id(p), path)
    return [m for path, m in model.named_modules()
            if getattr(m, "quant_method", None) is not None
            and any(p is not None and owner[id(p)] != path for p in m._parameters.values())]


def layerwise_reload(worker, weights) -> set[str]:
    """Runs inside the vLLM worker (collective_rpc): `layerwise_load` plus the caches a reload resets."""
    from vllm.config import set_current_vllm_config

    runner = worker.model_runner
    with set_current_vllm_config(worker.vllm_config):
        seen = layerwise_load(runner.get_model(), runner.model_config, weights)
    reset_caches(runner)
    return seen


def direct_reload(worker, specs, weights) -> set[str]:
    """Runs inside the vLLM worker: `direct.direct_load` with a plan made once per layout (cached
    on the worker); the layerwise reload when the model cannot be planned."""
    from vllm.config import set_current_vllm_config

    from .direct import direct_load, plan_direct

    runner = worker.model_runner
    model = runner.get_model()
    plans = worker.__dict__.setdefault("_rlsync_direct_plans", {})
    if specs not in plans:
        tp1 = worker.vllm_config.parallel_config.world_size == 1
        plans[specs] = plan_direct(model, list(specs)) if tp1 else None
        if plans[specs] is None:
            log.warning("direct apply cannot place this model's tensors: using vLLM's layerwise reload")
    plan = plans[specs]
    with set_current_vllm_config(worker.vllm_config):
        if plan is None:
            seen = layerwise_load(model, runner.model_config, weights)
        else:
            seen = direct_load(model, plan, weights)
    reset_caches(runner)
    return seen


def direct_readback(worker, specs) -> dict:
    """Runs inside the vLLM worker: checkpoint name -> what the direct apply wrote for it (a row slice of what a
    repacked layer's kernel was packed from: its persistent buffer, or the fused staging of a variant in the
    engine's dtype; or the parameter kept in place: embedding, norms), no copy; {} when this layout was applied
    by the layerwise reload (no plan). The verifier's read-back (docs/verify.md)."""
    plan = worker.__dict__.get("_rlsync_direct_plans", {}).get(specs)
    if plan is None:
        return {}
    modules = dict(worker.model_runner.get_model().named_modules())
    out = {}
    for name, tg in plan.targets.items():
        repacked = tg.param == "weight" and tg.module in plan.buffers
        dst = plan.kernel_source(tg.module) if repacked else modules[tg.module]._parameters[tg.param].data
        out[name] = dst if tg.rows is None else dst[tg.rows]
    return out


def direct_parts(worker, specs) -> dict:
    """Runs inside the vLLM worker: the last direct apply of this layout in parts (`DirectPlan.parts`; {}: none)."""
    plan = worker.__dict__.get("_rlsync_direct_plans", {}).get(specs)
    return dict(plan.parts) if plan is not None else {}


def reset_caches(runner) -> None:
    """What vLLM's own reload resets after new weights (LoRA state, encoder and multi-modal caches)."""
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        fn = getattr(runner, reset, None)
        if fn is not None:
            fn()


def _double_buffer(worker, specs):
    """The worker's `DoubleBuffer` for this layout (made once; None when the direct plan cannot place it)."""
    from .double_buffer import DoubleBuffer
    from .direct import plan_direct

    model = worker.model_runner.get_model()
    dbs = worker.__dict__.setdefault("_rlsync_double", {})
    if specs not in dbs:
        tp1 = worker.vllm_config.parallel_config.world_size == 1
        plan = plan_direct(model, list(specs)) if tp1 else None
        # a quantized kernel keeps its packed state on the layer's scheme, which a shadow shares: drained only
        dbs[specs] = DoubleBuffer(model, plan) if plan is not None and not plan.quantized else None
    return dbs[specs]


def inflight_build(worker, specs, weights):
    """Runs inside the vLLM worker, off the decode path: build `weights` beside the live kernels
    (double_buffer.py); returns the `Built` to swap in, or None when this layout has no double buffer."""
    from vllm.config import set_current_vllm_config

    db = _double_buffer(worker, specs)
    if db is None:
        return None
    with set_current_vllm_config(worker.vllm_config):
        return db.build(weights)


def inflight_swap(worker, specs, built) -> bool:
    """Runs inside the vLLM worker between two decode steps: the live modules take `built`."""
    ok = _double_buffer(worker, specs).swap(built)
    if ok:
        reset_caches(worker.model_runner)
    return ok

