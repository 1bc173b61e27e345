"""`AdapterSlots`: many LoRA adapters (tenants x revisions) resident over one base model, LRU-bounded.

    slots = AdapterSlots(model, LoraConfig(rank=8), max_resident=128)   # peft-wraps `model`
    slots.model                               # the peft model the engine generates with
    name, into = slots.reserve(("policy.lora.a", 7))   # buffers to fetch that adapter into (a free slot,
                                              # or the least recently used unpinned one, evicted first)
    hub.fetch("policy.lora.a", 7, into=into); slots.commit(("policy.lora.a", 7), name)
    with slots.use(("policy.lora.a", 7)):     # pinned: never evicted or overwritten while a request runs
        model.generate(...)

Each (model, version) key owns its slot until evicted, so a new revision lands in another slot and a request
finishes on the revision it started with. The slot's tensors are the hub replica (fetched in place, no file, no
copy); `on_evict(key)` runs before a slot is reused (the receiver releases that replica at the hub, so a later
request for the key fetches it again from a peer or the trainer). Slots are made on first need (peft's
`add_adapter`), up to `max_resident`, and reused after that.

Simplifies: one adapter per `generate` call (peft's mixed-adapter batches are not used); one thread per engine.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator

import torch

from rlsync.core.lora import LoraConfig, adapter_tensors, add_adapter, apply_lora, base_tensors


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
        self.model = apply_lora(model, cfg, adapter="s0").eval()
        self.model.requires_grad_(False)
        self._free: list[_Slot] = [_Slot("s0")]
        self._made = 1
        self._by_key: OrderedDict[Hashable, _Slot] = OrderedDict()  # LRU order: oldest first
        self._extra_bufs: dict[str, dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()
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
            add_adapter(self.model, self.cfg, name)
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
        out = adapter_tensors(self.model, name)
        if self.extra:
            if name not in self._extra_bufs:
                self._extra_bufs[name] = {n: torch.zeros(s, dtype=d) for n, (s, d) in self.extra.items()}
            out.update(self._extra_bufs[name])
        return out

    def commit(self, key: Hashable, name: str) -> None:
        """The slot `name` (from `reserve`) now holds `key`, complete."""
        with self._lock:
            self._by_key[key] = _Slot(name, key)

    def abandon(self, name: str) -> None:
        """A reserved slot whose fetch failed goes back to the free list (its buffers may hold a mix)."""
        with self._lock:
            self._free.append(_Slot(name))

    def extra_of(self, key: Hashable) -> dict[str, torch.Tensor]:
        with self._lock:
            return self._extra_bufs.get(self._by_key[key].name, {})

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
            self.model.set_adapter(slot.name)
            yield slot.name
        finally:
            with self._lock:
                slot.pins -= 1
