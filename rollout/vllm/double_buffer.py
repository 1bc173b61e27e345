"""Double-buffered kernel weights: the next version is built beside the live one, then swapped in by reference.

On vLLM's CPU backend a linear layer computes with `layer.cpu_linear`, a closure over a kernel handle
its `quant_method.process_weights_after_loading` made from the weight (oneDNN `create_onednn_mm`, sgl's
packed weight, zentorch; docs/vllm.md). So a version can be made ready without touching the live model:

    db = DoubleBuffer(model, plan)        # plan: direct.plan_direct (where each checkpoint tensor goes)
    ready = db.build(weights)             # off the decode path: converting copies into the spare slot,
                                          # each touched layer's own repack run on a *shadow* of the layer
    db.swap(ready)                        # between two decode steps: module attributes re-pointed (~1 ms)

Each slot holds, per repacked linear layer, a bf16 buffer laid out like the fused parameter (q|k|v,
gate|up) and, per parameter that keeps its storage (embedding, norms), a twin tensor; a parameter shared
by two modules (the tied lm_head) maps to one twin, so the tie survives the swap. A shadow is a shallow
copy of the layer with its own `_parameters` dict: the repack writes `cpu_linear` and the emptied
`weight` on the shadow only. `swap` copies those onto the live modules. Two slots, alternating: the
slot being built is never the one the live kernels were made from (some kernels keep a reference to
their source weight), and a build never starts on a slot a pending `Built` still points at.

Cost: two more copies of the model in the engine's dtype (SmolLM2-135M bf16: 2 x 270 MB) plus the
kernels' own packed copies while two versions coexist. What the plan cannot place (direct.py falls back
to the layerwise reload then) has no double buffer: `plan_direct` returning None means no in-flight swap.
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Iterable

import torch

from .direct import DirectPlan


@dataclass(slots=True)
class Built:
    """A version made ready in one slot: what `swap` puts on each live module."""

    slot: int
    attrs: dict[str, dict] = field(default_factory=dict)
    """Module path -> plain attributes to set (the repacked kernel: `cpu_linear`)."""
    params: dict[str, dict[str, torch.nn.Parameter]] = field(default_factory=dict)
    """Module path -> parameters to put in its `_parameters`."""
    names: set[str] = field(default_factory=set)
    """Checkpoint names the build consumed."""


class DoubleBuffer:
    def __init__(self, model: torch.nn.Module, plan: DirectPlan):
        self.model, self.plan = model, plan
        self.modules = dict(model.named_modules())
        self.live: int | None = None
        """Slot the live model was last swapped to (None: never). A drained apply (direct.py) re-points the
        linear kernels at its own buffers and writes the other parameters in place, so this slot stays live."""
        self.pending: Built | None = None
        """The last build, until it is swapped in or a newer build overwrites its slot."""
        self._lock = threading.Lock()
        # parameters that keep their storage, by identity: a tied parameter is one twin
        self._key: dict[tuple[str, str], int] = {}
        self._proto: dict[int, torch.nn.Parameter] = {}
        for tg in plan.targets.values():
            if tg.param == "weight" and tg.module in plan.buffers:
                continue
            p = self.modules[tg.module]._parameters[tg.param]
            self._proto.setdefault(id(p), p)
        for path, m in self.modules.items():
            for pn, p in m._parameters.items():
                if p is not None and id(p) in self._proto:
                    self._key[path, pn] = id(p)
        self.slots = [self._alloc() for _ in range(2)]

    def _alloc(self) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
        lin = {path: torch.zeros_like(buf) for path, buf in self.plan.buffers.items()}
        par = {k: torch.zeros_like(p.data) for k, p in self._proto.items()}
        return lin, par

    def _spare(self) -> int:
        with self._lock:
            s = 0 if self.live != 0 else 1
            if self.pending is not None and self.pending.slot == s:
                self.pending = None  # about to be overwritten: that older version can no longer be swapped in
            return s

    def build(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Built:
        """Write `weights` (checkpoint names; every tensor of the plan) into the spare slot and repack every
        touched layer on a shadow. The live model is not touched. Runs in any thread."""
        s = self._spare()
        lin, par = self.slots[s]
        out = Built(slot=s)
        with torch.no_grad():
            for name, t in weights:
                tg = self.plan.targets.get(name)
                if tg is None:
                    raise KeyError(f"in-flight build: {name} is not in the plan")
                if tg.param == "weight" and tg.module in lin:
                    dst = lin[tg.module]
                else:
                    dst = par[self._key[tg.module, tg.param]]
                (dst if tg.rows is None else dst[tg.rows]).copy_(t)
                out.names.add(name)
            twins = {k: torch.nn.Parameter(t, requires_grad=False) for k, t in par.items()}
            touched = {tg.module for tg in self.plan.targets.values()} | set(self.plan.reprocess)
            for (path, pn), k in self._key.items():
                out.params.setdefault(path, {})[pn] = twins[k]
                touched.add(path)
            for path in touched:
                m = self.modules[path]
                if path in lin:
                    out.params.setdefault(path, {})["weight"] = torch.nn.Parameter(lin[path], requires_grad=False)
                if path not in self.plan.reprocess:
                    continue
                shadow = copy.copy(m)
                shadow.__dict__["_parameters"] = dict(m._parameters, **out.params.get(path, {}))
                shadow.__dict__.pop("cpu_linear", None)
                m.quant_method.process_weights_after_loading(shadow)
                out.params[path] = {pn: p for pn, p in shadow._parameters.items() if p is not m._parameters.get(pn)}
                if "cpu_linear" in shadow.__dict__:
                    out.attrs[path] = {"cpu_linear": shadow.__dict__["cpu_linear"]}
        with self._lock:
            self.pending = out
        return out

    def swap(self, built: Built) -> bool:
        """Point the live modules at `built` (call between two forward passes: nothing may be computing);
        False, changing nothing, when a newer build has overwritten its slot since."""
        with self._lock:
            if self.pending is not built:
                return False
            for path, ps in built.params.items():
                self.modules[path]._parameters.update(ps)
            for path, attrs in built.attrs.items():
                self.modules[path].__dict__.update(attrs)
            self.live, self.pending = built.slot, None
            return True

