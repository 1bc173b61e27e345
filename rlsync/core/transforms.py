"""Registered, deterministic transforms that make a *variant* of a weight version (docs/derived.md).

A variant (`policy@bf16` v, `policy@int8` v) is an immutable version of its own, made from the base version
by one of these. Each is a pure function of the input bytes: elementwise casts and per-row reductions whose
result does not depend on thread count, vector width or who runs it (max is exact; the division and the
rounding are per element, IEEE round-to-nearest-even), so two workers that derive the same version get the
same bytes and the hub's manifest check proves it (tests/sync/test_transforms.py runs two processes).

    t = get_transform("bf16")
    out = t.allocate(t.specs(specs_of(params)))   # name -> empty tensor, once per engine
    t.apply(params, out)                          # writes the variant into `out`, returns CPU seconds

Simplifies: whole tensors on CPU; a sharded (ZeRO-3) version is derived per whole tensor after a resharding read.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from rlsync.core.registry import Registry

TRANSFORMS: Registry[type["Transform"]] = Registry("weight transform")
register_transform = TRANSFORMS.register

Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]


def specs_of(tensors: dict[str, torch.Tensor]) -> Specs:
    return {n: (tuple(t.shape), t.dtype) for n, t in tensors.items()}


class Transform(ABC):
    """A version -> variant function. `specs` says the variant's tensors from the base's; `apply` fills them."""

    name: ClassVar[str]
    revision: ClassVar[int] = 1
    """Bumped when the bytes a transform makes change: the hub records it beside the name."""
    same_layout: ClassVar[bool] = True
    """The variant has the base's tensor names and shapes (a cast): any engine of the model's own layout takes
    it. False (`int8` adds `*.weight_scale`): only an engine started in the variant's layout can."""

    @abstractmethod
    def specs(self, base: Specs) -> Specs: ...

    @abstractmethod
    def _fill(self, src: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> None: ...

    def params(self) -> dict:
        """What the hub records as this transform's parameters (with its name and revision)."""
        return {"revision": self.revision}

    @staticmethod
    def allocate(specs: Specs) -> dict[str, torch.Tensor]:
        return {n: torch.empty(shape, dtype=dt) for n, (shape, dt) in specs.items()}

    def apply(self, src: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> float:
        """Write the variant of `src` into `out` (laid out as `specs`); returns the CPU seconds it took."""
        want = self.specs(specs_of(src))
        got = specs_of(out)
        if got != want:
            bad = sorted(set(want) ^ set(got)) or [n for n in want if want[n] != got[n]]
            raise ValueError(f"transform {self.name!r}: output buffers differ from its specs at {bad[:3]}")
        t0 = time.thread_time()
        with torch.no_grad():
            self._fill(src, out)
        return time.thread_time() - t0


def _floating(dt: torch.dtype) -> bool:
    return dt.is_floating_point


@register_transform("bf16")
class BF16(Transform):
    """Every floating tensor cast to bfloat16 (round to nearest even); others unchanged."""

    name = "bf16"

    def specs(self, base: Specs) -> Specs:
        return {n: (s, torch.bfloat16 if _floating(dt) else dt) for n, (s, dt) in base.items()}

    def _fill(self, src, out) -> None:
        for n, t in src.items():
            out[n].copy_(t)


@register_transform("int8")
class Int8W8A8(Transform):
    """Linear weights (2-D tensors named `*proj.weight`) as int8 with one symmetric scale per output row,
    the layout of a compressed-tensors `int-quantized` W8A8 checkpoint (`NAME.weight` int8 [out, in],
    `NAME.weight_scale` fp32 [out, 1]); every other floating tensor cast to bf16. Activations are quantized
    by the engine per token at run time (dynamic), so they are no part of the variant."""

    name = "int8"
    suffix = "proj.weight"
    same_layout = False

    def _quantized(self, n: str, shape) -> bool:
        return n.endswith(self.suffix) and len(shape) == 2

    def specs(self, base: Specs) -> Specs:
        out: Specs = {}
        for n, (s, dt) in base.items():
            if self._quantized(n, s) and _floating(dt):
                out[n] = (s, torch.int8)
                out[n[:-len("weight")] + "weight_scale"] = ((s[0], 1), torch.float32)
            else:
                out[n] = (s, torch.bfloat16 if _floating(dt) else dt)
        return out

    def params(self) -> dict:
        return {"revision": self.revision, "targets": "*" + self.suffix, "scale": "absmax/127 per row",
                "other": "bf16"}

    def _fill(self, src, out) -> None:
        for n, t in src.items():
            if not self._quantized(n, t.shape) or not _floating(t.dtype):
                out[n].copy_(t)
                continue
            w = t.float()
            scale = out[n[:-len("weight")] + "weight_scale"]
            torch.amax(w.abs(), dim=1, keepdim=True, out=scale)
            scale.clamp_(min=1e-12).div_(127.0)
            out[n].copy_(torch.round(w / scale).clamp_(-127, 127))


def get_transform(name: str) -> Transform:
    return TRANSFORMS.get(name)()


def transform_names() -> list[str]:
    return TRANSFORMS.names()


class VariantReader:
    """A reader of variant `transform` of `model` through a hub client (duck-typed: `fetch`, `release`,
    `fetch_variant`): the hub lets the first reader of each version derive it (fetch the base into reusable
    scratch buffers, transform, publish), every other reads the variant from its holders.

    `conversion_s` / `derivations`: CPU seconds spent transforming and versions derived by this reader
    (what `bench derived` sums over a pool: once per version, not once per engine)."""

    def __init__(self, hub, model: str, transform: str, *, keep_scratch: bool = True):
        """`keep_scratch`: keep the base version's buffers between derivations (no page faults next time;
        costs one copy of the base in memory)."""
        self.hub, self.model, self.transform, self.keep_scratch = hub, model, get_transform(transform), keep_scratch
        self.variant_model = f"{model}@{self.transform.name}"
        self.scratch: dict[str, torch.Tensor] | None = None
        self.conversion_s, self.derivations, self.base_bytes = 0.0, 0, 0
        self._base_read = None  # the base version's FetchResult of the derivation under way (fetch() reports it)

    def _make(self, version: int, into: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        base = self.hub.fetch(self.model, version, into=self.scratch)
        self.scratch, self.base_bytes, self._base_read = base.tensors, self.base_bytes + base.nbytes, base
        out = into if into is not None else self.transform.allocate(self.transform.specs(specs_of(base.tensors)))
        try:
            self.conversion_s += self.transform.apply(base.tensors, out)
            self.derivations += 1
        finally:
            self.hub.release(self.model, base.version)  # peers read the variant from here, not the base
            if not self.keep_scratch:
                self.scratch = None
        return out

    def publish_from(self, version: int, base: dict[str, torch.Tensor], into: dict[str, torch.Tensor] | None = None):
        """The base's own publisher (the trainer, `sync.variant_by=trainer`): derive `version`'s variant from
        its live tensors `base` (no fetch) into `into` and publish it, unless another worker already has."""
        def make(v: int, out: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
            out = out if out is not None else self.transform.allocate(self.transform.specs(specs_of(base)))
            self.conversion_s += self.transform.apply(base, out)
            self.derivations += 1
            return out
        return self.hub.fetch_variant(self.model, version, self.transform.name, make, into=into,
                                      params=self.transform.params())

    def fetch(self, version, into: dict[str, torch.Tensor] | None = None, on_unit=None):
        """The variant of `version` ('latest' or an int) in `into` (allocated when None): a hub `FetchResult`
        whose `mode` is "derived" when this reader made it; its `nbytes`, `bytes_by_source` and `transports` are
        then the base version's read that made it (what moved to this worker; the hub's own result says 0)."""
        self._base_read = None
        res = self.hub.fetch_variant(self.model, version, self.transform.name, self._make, into=into,
                                     params=self.transform.params(), on_unit=on_unit)
        base, self._base_read = self._base_read, None
        if res.mode == "derived" and base is not None:
            res.nbytes, res.bytes_by_source, res.transports = base.nbytes, dict(base.bytes_by_source), dict(base.transports)
        return res
