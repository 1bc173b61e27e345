"""Direct apply: a new weight version into a running vLLM model without its per-tensor reload path.

vLLM's layerwise reload (`worker_apply.layerwise_load`) restores every layer's parameters on the
meta device, wraps every weight loader, buffers each tensor's bound arguments, materializes the
layer, replays the loaders (a narrow + copy per checkpoint tensor) and then runs the layer's
`process_weights_after_loading`. On the CPU backend that last step is what matters: it repacks a
linear layer's weight into the GEMM kernel's layout (oneDNN `create_onednn_mm`, or sgl's
`convert_weight_packed` on AMX machines) and drops the `nn.Parameter` to size 0 (an int8 W8A8 layer's
to None: its oneDNN handler holds the packed weight), so neither the parameter's storage nor a swap
of it reaches the kernel: the packed copy is the kernel's own.

The direct apply does only the necessary part, with the layout worked out once per engine:

* every fused parameter (qkv_proj = q | k | v, gate_up_proj = gate | up, stacked along dim 0 in
  `packed_modules_mapping` order) gets a persistent buffer in the loaded dtype (bf16; int8 for a W8A8
  layer), laid out like the parameter; each checkpoint tensor is one contiguous row slice of it;
* each linear layer whose weight was repacked gets a weight back and its own
  `quant_method.process_weights_after_loading` (the same kernel selection vLLM made at load: oneDNN,
  sgl or zentorch; for int8 `CPUInt8ScaledMMLinearKernel`, which also re-derives its azp term) repacks it.
  That weight is the **staged tensors themselves** when they already are the layer's whole weight in its
  dtype (a bf16 or int8 variant fetched into fused staging: q|k|v consecutive rows of one storage), else
  the buffer after one (converting) copy per checkpoint tensor. After a repack straight from staging
  the layer is checked to keep no reference to it (the staging is refilled by the next prefetch while
  the engine generates); a kernel that keeps one (zentorch without prepacking, the torch fallback) is
  repacked again from the buffer, and always from the buffer afterwards (`keeps_source`);
* parameters that keep their storage (embedding, norms, an int8 layer's per-row scales) are copied into
  in place; a module sharing a written parameter (the tied `lm_head`) is re-processed too; an input
  embedding's unused GEMM copy is not (`_unused_head_copy`).

Cost: one extra copy of the repacked linear weights in the loaded dtype (the buffers; for SmolLM2-135M
in bf16 ~ 200 MB). Anything the plan does not recognise (a name vLLM would rename, a quantization
scheme other than plain or CPU int8 W8A8 with dynamic activations, a shape that differs, tensor
parallelism) makes `plan_direct` return None and the engine uses the layerwise reload instead, so the
direct path is an optimisation, never a guess. Each apply's parts are timed (`DirectPlan.parts`).
Correctness: `tests/vllm/test_vllm_engine.py` compares greedy outputs and log-probs after a direct
apply with the layerwise reload's and with the trainer's model; `bench derived --probe-int8` the int8
engine's with an engine started from the same int8 checkpoint.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterable

import torch

log = logging.getLogger(__name__)

_PLAIN = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
_DROPPED_WEIGHT_DTYPE = {"int8": torch.int8}
"""Loaded dtype of a weight the kernel's set-up dropped to None (nothing left to read it from)."""


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
    quantized: bool = False
    """Some layer runs a quantized kernel (int8 W8A8): its set-up state lives on the layer's scheme, shared
    by any shallow copy of the layer, so no double buffer (in-flight build) for this plan."""
    sources: dict[str, torch.Tensor] = field(default_factory=dict)
    """Module path -> the weight its kernel was last packed from (its buffer, or the staged tensors)."""
    keeps_source: set[str] = field(default_factory=set)
    """Layers whose kernel was seen keeping a reference to its source weight: always packed from the buffer."""
    owns_copy: set[str] = field(default_factory=set)
    """Layers whose kernel was seen keeping nothing of the staging it was packed from (checked at the first such
    pack: the kernel a layer gets depends on its shape, dtype and the CPU, the same at every apply)."""
    parts: dict[str, float] = field(default_factory=dict)
    """The last apply, in parts (seconds; `layers_from_staging` / `layers_copied` are counts): `stream_s`
    waiting on the weights' iterator (the stage's checksum re-check), `copy_linear_s` into the linear
    buffers, `copy_in_place_s` (embedding, norms, scales), `repack_<kind>_s` per layer kind (qkv_proj,
    o_proj, gate_up_proj, down_proj, lm_head, ...), `other_s` (the rest: placing weights, Python), `total_s`."""

    def kernel_source(self, path: str) -> torch.Tensor:
        """What `path`'s kernel was last packed from (the read-back of a repacked layer)."""
        return self.sources.get(path, self.buffers[path])


def _kind(module) -> str | None:
    """How the direct apply re-runs this module's kernel set-up: "plain" (unquantized), "int8" (a
    compressed-tensors W8A8 int8 layer with dynamic per-token activations on vLLM's CPU int8 kernel; its
    scales come with the version), None: it cannot (the caller then uses vLLM's layerwise reload)."""
    qm = getattr(module, "quant_method", None)
    if qm is None or type(qm).__name__ in _PLAIN:
        return "plain"
    scheme = getattr(module, "scheme", None)
    if (type(qm).__name__ == "CompressedTensorsLinearMethod" and type(scheme).__name__ == "CompressedTensorsW8A8Int8"
            and type(getattr(scheme, "kernel", None)).__name__ == "CPUInt8ScaledMMLinearKernel"
            and not scheme.is_static_input_scheme):  # a static input scale is not part of a variant
        return "int8"
    return None


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


def _dropped(p) -> bool:
    """A parameter the kernel's set-up repacked away (size 0) or released (None)."""
    return p is None or p.numel() == 0


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
            if pname not in m._parameters or _kind(m) is None:
                return None
            p = m._parameters[pname]
            if _dropped(p):  # rebuilt in a buffer below: only a layer's own weight can be
                if pname != "weight" or not hasattr(m, "output_partition_sizes"):
                    return None
            elif tuple(p.shape) != tuple(shape):
                return None
            targets[name] = _Target(mod_path, pname, None)
        elif leaf in part_of:
            fused, i = part_of[leaf]
            fpath = f"{head}.{fused}" if head else fused
            m = modules.get(fpath)
            if m is None or pname not in m._parameters or _kind(m) is None:
                return None
            fused_parts.setdefault(f"{fpath}.{pname}", []).append((i, name))
        else:
            return None
    for key, parts in fused_parts.items():
        fpath, _, pname = key.rpartition(".")
        m = modules[fpath]
        parts.sort()
        if [i for i, _ in parts] != list(range(len(packed[fpath.rpartition(".")[2]]))):
            return None  # a shard missing from the version
        rows = [shapes[n][0] for _, n in parts]
        if not _fused_rows(m, rows) or len({tuple(shapes[n][1:]) for _, n in parts}) != 1:
            return None
        p = m._parameters[pname]
        if not _dropped(p) and tuple(p.shape) != (sum(rows), *shapes[parts[0][1]][1:]):
            return None  # kept in place (scales): must be the parts stacked
        start = 0
        for (_, n), r in zip(parts, rows):
            targets[n] = _Target(fpath, pname, slice(start, start + r))
            start += r
    buffers: dict[str, torch.Tensor] = {}
    reprocess: list[str] = []
    written = {(t.module, t.param) for t in targets.values()}
    for path, m in modules.items():
        own = [(path, pn) for pn in m._parameters]
        if not any(k in written for k in own):
            continue
        if "weight" in m._parameters and _dropped(m._parameters["weight"]):
            # repacked by process_weights_after_loading: rebuild its weight in a persistent buffer
            names = [n for n, t in targets.items() if t.module == path and t.param == "weight"]
            if not names:
                return None
            rows = sum(shapes[n][0] for n in names)
            cols = shapes[names[0]][1:]
            if (sum(getattr(m, "output_partition_sizes", [-1])) != rows
                    or (getattr(m, "input_size_per_partition", None),) != tuple(cols)):
                return None  # not the layer's own (output, input) shape
            w = m._parameters["weight"]
            dtype = w.dtype if w is not None else _DROPPED_WEIGHT_DTYPE.get(_kind(m))
            if dtype is None:
                return None
            buffers[path] = torch.zeros((rows, *cols), dtype=dtype)
        if getattr(m, "quant_method", None) is not None and not _unused_head_copy(model, m):
            reprocess.append(path)
    # modules sharing a written parameter (tied lm_head): their kernels read a packed copy too
    written_params = {id(modules[mp]._parameters[pn]) for mp, pn in written if not _dropped(modules[mp]._parameters[pn])}
    for path, m in modules.items():
        if path in reprocess or getattr(m, "quant_method", None) is None or _unused_head_copy(model, m):
            continue
        if any(id(p) in written_params for p in m._parameters.values() if p is not None):
            if _kind(m) is None:
                return None
            reprocess.append(path)
    return DirectPlan(targets=targets, buffers=buffers, reprocess=reprocess,
                      quantized=any(_kind(modules[p]) != "plain" for p in reprocess))


def _whole(buf: torch.Tensor, parts: list[tuple[slice | None, torch.Tensor]]) -> torch.Tensor | None:
    """`parts` (row slice, staged tensor) as one tensor shaped and typed like `buf` without a copy, when
    they are its rows in order, consecutive in one storage (fused staging); else None."""
    parts = sorted(parts, key=lambda rt: 0 if rt[0] is None else rt[0].start)
    first = parts[0][1] if parts else None
    if first is None or any(t.dtype != buf.dtype or not t.is_contiguous() or t.device != buf.device for _, t in parts):
        return None
    row, ptr, storage = 0, first.data_ptr(), first.untyped_storage().data_ptr()
    for rows, t in parts:
        r0, r1 = (0, buf.shape[0]) if rows is None else (rows.start, rows.stop)
        if (r0 != row or tuple(t.shape) != (r1 - r0, *buf.shape[1:]) or t.data_ptr() != ptr
                or t.untyped_storage().data_ptr() != storage):
            return None
        row, ptr = r1, ptr + t.nbytes
    if row != buf.shape[0]:
        return None
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), buf.shape, buf.stride())


def _refers_to(m, src: torch.Tensor) -> bool:
    """Does module `m`'s kernel state (its parameters, tensor attributes, its `cpu_linear` closure, its
    scheme's kernel) still hold memory of `src`? Then `src` cannot be refilled while the layer computes."""
    lo = src.untyped_storage().data_ptr()
    hi = lo + src.untyped_storage().nbytes()
    seen: list = list(m._parameters.values()) + list(m._buffers.values()) + list(vars(m).values())
    for fn in (getattr(m, "cpu_linear", None),):
        seen += [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if c.cell_contents is not None]
    kernel = getattr(getattr(m, "scheme", None), "kernel", None)
    if kernel is not None:
        seen += list(vars(kernel).values())
    return any(isinstance(t, torch.Tensor) and t.numel() and lo <= t.untyped_storage().data_ptr() < hi for t in seen)


def direct_load(model, plan: DirectPlan, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Write `weights` (checkpoint names) into `model` as `plan` says, then re-run the kernels'
    packing of every touched layer; returns the names consumed. Runs inside the vLLM worker."""
    modules = dict(model.named_modules())
    seen: set[str] = set()
    parts: dict[str, float] = {"stream_s": 0.0, "copy_linear_s": 0.0, "copy_in_place_s": 0.0,
                               "layers_from_staging": 0, "layers_copied": 0}
    staged: dict[str, list[tuple[slice | None, torch.Tensor]]] = {}  # repacked layer -> its staged weight parts
    clock = time.perf_counter
    t_start = clock()
    with torch.no_grad():
        it = iter(weights)
        while True:
            t0 = clock()
            item = next(it, None)
            t1 = clock()
            parts["stream_s"] += t1 - t0
            if item is None:
                break
            name, t = item
            tg = plan.targets.get(name)
            if tg is None:
                raise KeyError(f"direct apply: {name} is not in the plan")
            if tg.param == "weight" and tg.module in plan.buffers:
                staged.setdefault(tg.module, []).append((tg.rows, t))  # placed when its layer is repacked
            else:
                dst = modules[tg.module]._parameters[tg.param].data
                (dst if tg.rows is None else dst[tg.rows]).copy_(t)
                parts["copy_in_place_s"] += clock() - t1
            seen.add(name)
        for path in plan.reprocess:
            m = modules[path]
            buf = plan.buffers.get(path)
            src = None
            if buf is not None:
                got = staged.get(path, [])
                src = _whole(buf, got) if path not in plan.keeps_source else None
                if src is None:
                    _copy_into(buf, got, parts)
                    src = buf
                m.weight = torch.nn.Parameter(src, requires_grad=False)
            t0 = clock()
            m.quant_method.process_weights_after_loading(m)
            if src is not None and src is not buf and path not in plan.owns_copy and _refers_to(m, src):
                log.warning("%s: its kernel keeps a reference to the weight it was packed from: packing it from "
                            "the engine's own buffer from now on", path)
                plan.keeps_source.add(path)
                _copy_into(buf, staged.get(path, []), parts)
                src = buf
                m.weight = torch.nn.Parameter(buf, requires_grad=False)
                m.quant_method.process_weights_after_loading(m)
            if src is not None:
                plan.sources[path] = src
                parts["layers_from_staging" if src is not buf else "layers_copied"] += 1
                if src is not buf:
                    plan.owns_copy.add(path)
            key = f"repack_{path.rpartition('.')[2]}_s"
            parts[key] = parts.get(key, 0.0) + clock() - t0
    parts["total_s"] = clock() - t_start
    parts["other_s"] = parts["total_s"] - sum(v for k, v in parts.items() if k.endswith("_s") and k != "total_s")
    plan.parts = parts
    return seen


def _copy_into(buf: torch.Tensor, staged: list[tuple[slice | None, torch.Tensor]], parts: dict) -> None:
    t0 = time.perf_counter()
    for rows, t in staged:
        (buf if rows is None else buf[rows]).copy_(t)
    parts["copy_linear_s"] += time.perf_counter() - t0
