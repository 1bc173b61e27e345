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

Simplifies: one adapter per `generate` call, and one call at a time per engine (`use` holds a lock).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator

import torch

from rlsync.core.lora import LoraConfig, adapter_parameters, apply_lora, base_tensors


class AdapterCapacityError(RuntimeError):
    """Every adapter slot is pinned by a running request: none can be evicted for a new adapter."""


@dataclass
class _Slot:
    name: str
    key: Hashable | None = None
    pins: int = 0


class AdapterSlots:
    def __init__(self, model: torch.nn.Module, cfg: LoraConfig, max_resident: int, *, extra: dict | None = None):
        """`extra`: name -> (shape, dtype) of tensors each adapter version carries beside its weights (the
        hub's base record): every slot gets its own buffers for them."""
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

    def base_tensors(self) -> dict[str, torch.Tensor]:
        """name -> live tensor of the base (HF names): the hub fetches the base version into these."""
        return base_tensors(self.model)

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
                yield slot.name
        finally:
            with self._lock:
                slot.pins -= 1
