"""Direct apply: a new weight version into a running vLLM model without its per-tensor reload path.

vLLM's layerwise reload (`worker_apply.layerwise_load`) restores every layer's parameters on the
meta device, wraps every weight loader, buffers each tensor's bound arguments, materializes the
layer, replays the loaders (a narrow + copy per checkpoint tensor) and then runs the layer's
`process_weights_after_loading`. On the CPU backend that last step is what matters: it repacks a
linear layer's weight into the GEMM kernel's layout (oneDNN `create_onednn_mm`, or sgl's
`convert_weight_packed` on AMX machines) and drops the `nn.Parameter` to size 0, so neither the
parameter's storage nor a swap of it reaches the kernel: the packed copy is the kernel's own.

The direct apply does only the necessary part, with the layout worked out once per engine:

* every fused parameter (qkv_proj = q | k | v, gate_up_proj = gate | up, stacked along dim 0 in
  `packed_modules_mapping` order) gets a persistent buffer in the engine's dtype, laid out like the
  parameter; each checkpoint tensor is one contiguous row slice of it, so writing a version is one
  copy per checkpoint tensor into memory touched before (no page faults): a converting one (fp32 -> bf16)
  for the trainer's fp32 version, a plain one for its bf16 variant (`sync.variant=bf16`, docs/derived.md);
* each linear layer whose weight was repacked gets its buffer back as its `weight` and its own
  `quant_method.process_weights_after_loading` (the same kernel selection vLLM made at load: oneDNN,
  sgl or zentorch, whichever this CPU uses) repacks it; parameters that keep their storage
  (embedding, norms) are copied into in place; a module sharing a written parameter (the tied
  `lm_head`) is re-processed too; an input embedding's unused GEMM copy is not (`_unused_head_copy`).

Cost: one extra copy of the repacked linear weights in the engine's dtype (the buffers; for
SmolLM2-135M in bf16 ~ 200 MB). Anything the plan does not recognise (a name vLLM would rename, a
quantized layer, a shape that differs, tensor parallelism) makes `plan_direct` return None and the
engine uses the layerwise reload instead, so the direct path is an optimisation, never a guess.
Correctness: `tests/vllm/test_vllm_engine.py` compares greedy outputs and log-probs after a direct
apply with the layerwise reload's and with the trainer's model.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable

import torch

log = logging.getLogger(__name__)

_UNQUANTIZED = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")


@dataclass(slots=True)
class _Target:
    module: str
    """vLLM module path."""
    param: str
    """Parameter name on that module."""
    rows: slice | None
    """Rows of the (fused) parameter this checkpoint tensor fills; None: the whole parameter."""


@dataclass(slots=True)
class DirectPlan:
    targets: dict[str, _Target]
    """Checkpoint name -> where it goes."""
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    """Module path -> persistent weight buffer of a repacked linear layer."""
    reprocess: list[str] = field(default_factory=list)
    """Modules whose `process_weights_after_loading` runs after every apply (repacked or tied)."""


def _quant_ok(module) -> bool:
    qm = getattr(module, "quant_method", None)
    return qm is None or type(qm).__name__ in _UNQUANTIZED


def _fused_rows(module, shard_rows: list[int]) -> bool:
    sizes = getattr(module, "output_partition_sizes", None)
    return sizes is not None and list(sizes) == shard_rows


def _unused_head_copy(model, m) -> bool:
    """An input embedding of a model with its own `lm_head` module: on CPU its quant method packs a
    GEMM copy of the table that only a logits head reads (Gemma-style models pass the embedding as the
    head; then there is no separate `lm_head` and it is re-packed). Skipping it saves one pack of the
    vocabulary table per apply (~0.09 s for SmolLM2's 49k x 576 here)."""
    head = getattr(model, "lm_head", None)
    return (type(getattr(m, "quant_method", None)).__name__ == "UnquantizedEmbeddingMethod"
            and type(m).__name__ == "VocabParallelEmbedding" and isinstance(head, torch.nn.Module) and head is not m)


def plan_direct(model, specs: list[tuple[str, tuple[int, ...]]]) -> DirectPlan | None:
    """Where each checkpoint tensor (`specs`: name, shape) goes in `model`, or None when any of them
    cannot be placed without vLLM's own loader (the caller falls back to the layerwise reload)."""
    if getattr(getattr(model, "hf_to_vllm_mapper", None), "orig_to_new_prefix", None):
        return None  # renamed prefixes (multimodal wrappers): leave to vLLM's loader
    modules = dict(model.named_modules())
    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
    part_of = {p: (fused, i) for fused, parts in packed.items() for i, p in enumerate(parts)}
    shapes = dict(specs)
    targets: dict[str, _Target] = {}
    fused_parts: dict[str, list[tuple[int, str]]] = {}
    for name, shape in specs:
        mod_path, _, pname = name.rpartition(".")
        head, _, leaf = mod_path.rpartition(".")
        if mod_path in modules and leaf not in part_of:
            m = modules[mod_path]
            p = m._parameters.get(pname)
            if p is None or not _quant_ok(m):
                return None
            if p.numel() and tuple(p.shape) != tuple(shape):
                return None
            if not p.numel() and not hasattr(m, "output_partition_sizes"):
                return None
            targets[name] = _Target(mod_path, pname, None)
        elif leaf in part_of:
            fused, i = part_of[leaf]
            fpath = f"{head}.{fused}" if head else fused
            m = modules.get(fpath)
            if m is None or pname not in m._parameters or not _quant_ok(m):
                return None
            fused_parts.setdefault(f"{fpath}.{pname}", []).append((i, name))
        else:
            return None
    buffers: dict[str, torch.Tensor] = {}
    for key, parts in fused_parts.items():
        fpath, _, pname = key.rpartition(".")
        m = modules[fpath]
        parts.sort()
        if [i for i, _ in parts] != list(range(len(packed[fpath.rpartition(".")[2]]))):
            return None  # a shard missing from the version
        rows = [shapes[n][0] for _, n in parts]
        if not _fused_rows(m, rows) or len({tuple(shapes[n][1:]) for _, n in parts}) != 1:
            return None
        start = 0
        for (_, n), r in zip(parts, rows):
            targets[n] = _Target(fpath, pname, slice(start, start + r))
            start += r
    reprocess: list[str] = []
    written = {(t.module, t.param) for t in targets.values()}
    for path, m in modules.items():
        own = [(path, pn) for pn in m._parameters]
        if not any(k in written for k in own):
            continue
        if "weight" in m._parameters and m._parameters["weight"].numel() == 0:
            # repacked by process_weights_after_loading: rebuild its weight in a persistent buffer
            names = [n for n, t in targets.items() if t.module == path and t.param == "weight"]
            if not names:
                return None
            rows = sum(shapes[n][0] for n in names)
            cols = shapes[names[0]][1:]
            if (sum(getattr(m, "output_partition_sizes", [-1])) != rows
                    or (getattr(m, "input_size_per_partition", None),) != tuple(cols)):
                return None  # not the layer's own (output, input) shape
            buffers[path] = torch.zeros((rows, *cols), dtype=m._parameters["weight"].dtype)
        if getattr(m, "quant_method", None) is not None and not _unused_head_copy(model, m):
            reprocess.append(path)
    # modules sharing a written parameter (tied lm_head): their kernels read a packed copy too
    written_params = {id(modules[mp]._parameters[pn]) for mp, pn in written if modules[mp]._parameters[pn].numel()}
    for path, m in modules.items():
        if path in reprocess or getattr(m, "quant_method", None) is None or _unused_head_copy(model, m):
            continue
        if any(id(p) in written_params for p in m._parameters.values() if p is not None):
            if not _quant_ok(m):
                return None
            reprocess.append(path)
    return DirectPlan(targets=targets, buffers=buffers, reprocess=reprocess)


def direct_load(model, plan: DirectPlan, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Write `weights` (checkpoint names) into `model` as `plan` says, then re-run the kernels'
    packing of every touched layer; returns the names consumed. Runs inside the vLLM worker."""
    modules = dict(model.named_modules())
    seen: set[str] = set()
    with torch.no_grad():
        for name, t in weights:
            tg = plan.targets.get(name)
            if tg is None:
                raise KeyError(f"direct apply: {name} is not in the plan")
            buf = plan.buffers.get(tg.module) if tg.param == "weight" else None
            dst = buf if buf is not None else modules[tg.module]._parameters[tg.param].data
            (dst if tg.rows is None else dst[tg.rows]).copy_(t)
            seen.add(name)
        for path in plan.reprocess:
            m = modules[path]
            buf = plan.buffers.get(path)
            if buf is not None:
                m.weight = torch.nn.Parameter(buf, requires_grad=False)
            m.quant_method.process_weights_after_loading(m)
    return seen
