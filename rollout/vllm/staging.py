"""What a vLLM engine's host staging holds and how it is checked (no I/O, no vLLM import).

    staging = fused_staging(layout)            # whole tensors; q/k/v, gate/up row blocks of fused buffers
    for name, t in checked_tensors(staging, manifest): ...   # each unit re-checked before it is handed out
    specs_of(manifest)                          # (name, shape) the direct apply plans with
    Landing()                                   # which tensors of a fetch in progress are complete

`rollout.vllm.stage.HubWeightStage` uses these; `rollout.vllm.transfer_backend` (vLLM's weight-transfer backend) too.
"""
from __future__ import annotations

import threading
from typing import Iterable, Iterator

import torch

from rlsync.hub import ShardedLayout


class WeightIntegrityError(RuntimeError):
    """Bytes about to be applied do not match the version's manifest checksums."""


class VariantLayoutError(ValueError):
    """A stage asked for a variant whose tensor layout is not the one the engine was started in."""


def check_variant_layout(variant: str | None, started: str | None) -> None:
    """Refuse reading `variant` (None: the version as published) into an engine started in variant `started`'s
    layout (None: the model's own): an engine started from an int8 checkpoint takes only `int8`, and `int8`
    (its own tensor names, `*.weight_scale`) goes only into such an engine; vLLM's reload would take the bytes
    under the other layout's names without an error (wrong weights, docs/derived.md)."""
    from rlsync.core.transforms import get_transform

    same = variant is None or get_transform(variant).same_layout
    if started is not None and variant != started:
        raise VariantLayoutError(f"this vLLM engine was started from the {started} checkpoint: it takes only the "
                                 f"{started!r} variant (asked for {variant or 'the version as published'})")
    if not same and started != variant:
        raise VariantLayoutError(f"the {variant!r} variant needs an engine started from its checkpoint "
                                 f"(rollout.vllm.model_dir.prepare_variant); this one loaded the model's own layout")


def checked_tensors(tensors: dict[str, torch.Tensor], manifest, order: Iterable[int] | None = None, *,
                    verify: bool = True, what: str = "weights") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) of `tensors` in `order` (manifest tensor indices; all by default), checking
    each unit against the manifest checksums the first time one of its tensors is handed out.
    Raises `WeightIntegrityError` at the first mismatch (before that tensor is yielded)."""
    unit_of: list[list[int]] = [[] for _ in manifest.tensors]
    for u, unit in enumerate(manifest.units):
        for ti, _, _ in unit.segments:
            unit_of[ti].append(u)
    checked: set[int] = set()
    for ti in (range(len(manifest.tensors)) if order is None else order):
        todo = [u for u in unit_of[ti] if u not in checked]
        if todo and verify:
            bad = manifest.verify(tensors, todo)
            if bad:
                raise WeightIntegrityError(
                    f"{what}: {len(bad)} unit(s) of {manifest.tensors[ti].name} do not match the "
                    "version's manifest checksums; update refused")
        checked.update(todo)
        spec = manifest.tensors[ti]
        yield spec.name, tensors[spec.name]


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""vLLM's `packed_modules_mapping` for Llama/Qwen2-style models: fused module -> its parts, stacked along dim 0."""


def fused_staging(layout: ShardedLayout, fused: dict[str, tuple[str, ...]] = FUSED) -> dict[str, torch.Tensor]:
    """Whole-tensor staging for `layout`, each fused group's parts (q/k/v, gate/up of one layer: same dtype and
    trailing shape) row blocks of one buffer laid out like vLLM's fused parameter, so a resharding read lands
    them there in place; every other tensor its own buffer. Returns name -> tensor (views for the parts)."""
    return fused_buffers(layout.specs(), fused)


def fused_buffers(specs: dict[str, tuple[tuple[int, ...], str]],
                  fused: dict[str, tuple[str, ...]] = FUSED) -> dict[str, torch.Tensor]:
    """`fused_staging` for `specs` (name -> (shape, dtype name)): a variant fetched into these, in the engine's
    dtype, is each fused layer's whole weight already, so the direct apply packs it from there (direct.py)."""
    from rlsync.hub import dtype_from_name

    out: dict[str, torch.Tensor] = {}
    for name, (shape, dt) in specs.items():
        if name in out:
            continue
        for parts in fused.values():
            stem, leaf = name.rpartition(".")[0].rpartition("."), name.rpartition(".")[2]
            if stem[2] != parts[0]:
                continue
            group = [f"{stem[0]}.{p}.{leaf}" for p in parts]
            got = [specs.get(g) for g in group]
            if all(g is not None and len(g[0]) >= 1 and g[0][1:] == shape[1:] and g[1] == dt for g in got):
                buf = torch.empty((sum(g[0][0] for g in got), *shape[1:]), dtype=dtype_from_name(dt))
                row = 0
                for g, (gs, _) in zip(group, got):
                    out[g] = buf[row:row + gs[0]]
                    row += gs[0]
            break
        if name not in out:
            out[name] = torch.empty(shape, dtype=dtype_from_name(dt))
    return out


def specs_of(manifest) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """(name, shape) of every tensor of a version: what the engine's direct apply plans with."""
    return tuple((s.name, tuple(s.shape)) for s in manifest.tensors)


class Landing:
    """Which tensors of a fetch in progress are complete (all their units landed and verified): the pipelined
    update (stage.py) hands each to the engine as soon as it is."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.manifest = None
        self.units_left: list[int] = []
        self.ready: list[int] = []  # tensor indices, in completion order
        self.done = False
        self.error: BaseException | None = None
        self._unit_tensors: list[list[int]] = []

    def on_unit(self, manifest, u: int) -> None:
        with self.cond:
            if self.manifest is None:
                self.manifest = manifest
                self.units_left = [0] * len(manifest.tensors)
                self._unit_tensors = [sorted({ti for ti, _, _ in unit.segments}) for unit in manifest.units]
                for ts in self._unit_tensors:
                    for ti in ts:
                        self.units_left[ti] += 1
                self.ready = [i for i, n in enumerate(self.units_left) if n == 0]  # empty tensors
            for ti in self._unit_tensors[u]:
                self.units_left[ti] -= 1
                if self.units_left[ti] == 0:
                    self.ready.append(ti)
            self.cond.notify_all()

    def finish(self, manifest, error: BaseException | None) -> None:
        with self.cond:
            if error is None and self.manifest is None:  # already held: no unit was transferred
                self.manifest = manifest
                self.ready = list(range(len(manifest.tensors)))
            self.done, self.error = True, error
            self.cond.notify_all()
