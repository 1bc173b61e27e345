"""`AdapterSlots`: many LoRA adapters (tenants x revisions) resident over one base model, LRU-bounded.

    slots = AdapterSlots(model, LoraConfig(rank=8), max_resident=128)   # peft-wraps `model`
    slots.model                               # the peft model the engine generates with
    name, into = slots.reserve(("policy.lora.a", 7))   # buffers to fetch that adapter into (a free slot,
                                              # or the least recently used unpinned one, evicted first)
    hub.fetch("policy.lora.a", 7, into=into); slots.commit(("policy.lora.a", 7), name)
    with slots.use(("policy.lora.a", 7)):     # pinned: never evicted or overwritten while a request runs
        model.generate(...)

A slot is a set of plain tensors shaped like the adapter (the hub replica: fetched in place, no file, no copy).
The peft model has one adapter; `use` re-points its lora_A/lora_B parameters at the slot's tensors (a pointer
swap per tensor, as the in-flight switch does in rollout/engine.py), so switching tenants costs microseconds and
a slot costs only its bytes. peft's own multi-adapter API was measured and rejected: on SmolLM2-135M under load,
`add_adapter` took ~2 s per slot and `set_adapter` 0.3-1.2 s with 128 adapters (docs/lora.md).

Each (model, version) key owns its slot until evicted, so a new revision lands in another slot and a request
finishes on the revision it started with. `on_evict(key)` runs before a slot is reused (the receiver releases
that replica at the hub, so a later request for the key fetches it again from a peer or the trainer).

`merge=True` (`sync.merge_adapter`): a call samples with the adapter merged into a copy of the weights it adapts
(W + scaling * B @ A, made once per adapter key and kept until another key is used), so its forwards are the
plain model's (peft's per-module LoRA branch skipped). The base tensors themselves are never written (they are
the base version's hub replica); the copy costs the adapted layers' bytes (425 MB for SmolLM2-135M with every
linear layer). Numbers differ from the unmerged forward by float rounding (the trainer's log-probs are unmerged).

Simplifies: one adapter per `generate` call, and one call at a time per engine (`use` holds a lock).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator

import torch

from rlsync.core.lora import LoraConfig, adapter_parameters, apply_lora, base_parameters, base_tensors


class AdapterCapacityError(RuntimeError):
    """Every adapter slot is pinned by a running request: none can be evicted for a new adapter."""


@dataclass
class _Slot:
    name: str
    key: Hashable | None = None
    pins: int = 0


class AdapterSlots:
    def __init__(self, model: torch.nn.Module, cfg: LoraConfig, max_resident: int, *, extra: dict | None = None,
                 merge: bool = False):
        """`extra`: name -> (shape, dtype) of tensors each adapter version carries beside its weights (the
        hub's base record): every slot gets its own buffers for them. `merge`: see the module's doc."""
        if max_resident < 1:
            raise ValueError(f"max_resident must be >= 1 (got {max_resident})")
        self.cfg, self.max_resident = cfg, max_resident
        self.extra = dict(extra or {})
        self.model = apply_lora(model, cfg, adapter="live").eval()
        self.model.requires_grad_(False)
        self._live = adapter_parameters(self.model, "live")  # re-pointed at the slot in use
        self._free: list[_Slot] = []
        self._made = 0
        self._by_key: OrderedDict[Hashable, _Slot] = OrderedDict()  # LRU order: oldest first
        self._bufs: dict[str, dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self._calls = threading.Lock()  # one call at a time: the live parameters point at one slot
        self._active: str | None = None
        self.on_evict: Callable[[Hashable], None] | None = None
        self.evictions = 0
        self.merge = merge
        self._base = base_tensors(self.model)  # the base's own tensors (while merged, the layers point elsewhere)
        self._lora_layers = {n: m for n, m in self.model.named_modules() if hasattr(m, "lora_A") and "live" in m.lora_A}
        self._merged: dict[str, torch.Tensor] = {}  # layer name -> W + scaling * B @ A of `_merged_for`
        self._merged_for: Hashable | None = None
        self.merges = 0

    def base_tensors(self) -> dict[str, torch.Tensor]:
        """name -> live tensor of the base (HF names): the hub fetches the base version into these."""
        return dict(self._base)

    @torch.no_grad()
    def cast_base(self, dtypes: dict[str, torch.dtype]) -> None:
        """Hold the base in these dtypes from now on (name -> dtype, `base_tensors`' names; each tensor cast once):
        an engine serving a derived variant of the base (`sync.variant=bf16`) computes with the variant's own
        dtypes. The adapters keep theirs (fp32, as the trainer publishes them)."""
        with self._calls:
            for n, p in base_parameters(self.model).items():
                if p.dtype != dtypes[n]:
                    p.data = p.data.to(dtypes[n])
            self._base = base_tensors(self.model)
            self._merged.clear()  # made in the old dtypes
            self._merged_for = None

    def base_written(self) -> None:
        """The base tensors hold another base version now: the merged copy (made from the old one) is dropped."""
        with self._calls:
            self._merged_for = None

    def resident(self) -> list[Hashable]:
        """Keys resident now, least recently used first."""
        with self._lock:
            return list(self._by_key)

    def has(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._by_key

    def reserve(self, key: Hashable) -> tuple[str, dict[str, torch.Tensor]]:
        """A slot for `key` and the buffers to fetch its adapter into (adapter tensors + `extra`). A resident
        key is refused (it is immutable: fetch a new revision under a new key)."""
        with self._lock:
            if key in self._by_key:
                raise ValueError(f"adapter {key} is resident already")
            slot = self._take_slot()
        return slot.name, self._buffers(slot.name)

    def _take_slot(self) -> _Slot:
        if self._free:
            return self._free.pop()
        if self._made < self.max_resident:
            name = f"s{self._made}"
            self._bufs[name] = {n: torch.zeros_like(p.data) for n, p in self._live.items()}
            self._bufs[name].update({n: torch.zeros(s, dtype=d) for n, (s, d) in self.extra.items()})
            self._made += 1
            return _Slot(name)
        for key, slot in self._by_key.items():  # least recently used first
            if slot.pins == 0:
                del self._by_key[key]
                self.evictions += 1
                if self.on_evict is not None:
                    self.on_evict(key)
                slot.key = None
                return slot
        raise AdapterCapacityError(f"all {self.max_resident} adapter slots are pinned by running requests: "
                                   "raise max_resident or run fewer adapters at once")

    def _buffers(self, name: str) -> dict[str, torch.Tensor]:
        return dict(self._bufs[name])

    def shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """name -> (shape, dtype) of an adapter's tensors (what a publisher of adapters for this engine sends)."""
        return {n: (tuple(p.shape), p.dtype) for n, p in self._live.items()}

    def commit(self, key: Hashable, name: str) -> None:
        """The slot `name` (from `reserve`) now holds `key`, complete."""
        with self._lock:
            self._by_key[key] = _Slot(name, key)

    def abandon(self, name: str) -> None:
        """A reserved slot whose fetch failed goes back to the free list (its buffers may hold a mix)."""
        with self._lock:
            self._free.append(_Slot(name))

    def tensors_of(self, key: Hashable) -> dict[str, torch.Tensor]:
        """The resident adapter's tensors (`extra` included)."""
        with self._lock:
            return self._buffers(self._by_key[key].name)

    @contextmanager
    def use(self, key: Hashable) -> Iterator[str]:
        """Activate `key`'s adapter for the calls inside, pinned (never evicted meanwhile); most recently used."""
        with self._lock:
            if key not in self._by_key:
                raise KeyError(f"adapter {key} is not resident (fetch it first)")
            slot = self._by_key[key]
            self._by_key.move_to_end(key)
            slot.pins += 1
        try:
            with self._calls:
                if self._active != slot.name:
                    bufs = self._bufs[slot.name]
                    for n, p in self._live.items():
                        p.data = bufs[n]
                    self._active = slot.name
                if not self.merge:
                    yield slot.name
                    return
                self._merge_in(key)
                try:
                    yield slot.name
                finally:
                    self._merge_out()
        finally:
            with self._lock:
                slot.pins -= 1

    @torch.no_grad()
    def _merge_in(self, key: Hashable) -> None:
        """Point every adapted layer at W + scaling * B @ A of the active slot (made if `key` is not the one held)."""
        for name, layer in self._lora_layers.items():
            w = layer.base_layer.weight
            if self._merged_for != key:
                a, b = layer.lora_A["live"].weight, layer.lora_B["live"].weight
                out = self._merged.setdefault(name, torch.empty_like(w.data))
                torch.addmm(w.data, b.to(w.dtype), a.to(w.dtype), alpha=layer.scaling["live"], out=out)
            w.data = self._merged[name]
            layer.merged_adapters = ["live"]  # peft's forward then calls the base layer alone
        if self._merged_for != key:
            self._merged_for = key
            self.merges += 1

    def _merge_out(self) -> None:
        for name, layer in self._lora_layers.items():
            layer.base_layer.weight.data = self._base_weight(name)
            layer.merged_adapters = []

    def _base_weight(self, layer: str) -> torch.Tensor:
        return self._base[layer.replace("base_model.model.", "", 1) + ".weight"]
