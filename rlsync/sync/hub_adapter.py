"""`sync.mode=hub` with `trainer.lora.rank > 0`: the base published once, then each version is the adapter alone.

    publisher: rank 0's first publish registers the frozen base as version b of `policy` (no copy; never released:
               no step writes it), then every version v as `policy.lora` v: the live adapter tensors plus a
               one-element `ADAPTER_BASE` tensor holding b (the adapter names its base inside its own bytes)
    receiver:  ensure(min_version): one parked `wait_latest("policy.lora", min_version)`, then the adapter is
               fetched straight into a fresh slot of the engine (`AdapterSlots`, no file, no copy); if its base
               record names a base the engine does not hold, that base is fetched into the engine's base tensors

With `sync.variant=bf16` the engines serve the base's derived variant (`policy@bf16` b, as hub_derived reads whole
versions: the first engine to need it fetches b, casts it and publishes it, every other reads it from peers; with
`sync.variant_by=trainer` rank 0 derives it when it publishes b): the engine's base tensors are cast to the variant's
dtypes once, at start, and the variant is fetched into them. Adapters are not derived: they stay fp32 (the trainer's
own tensors) and apply over the bf16 base. Variants with their own layout (`int8`) are refused.

Every adapter revision keeps its own slot until the engine's LRU bound evicts it (the receiver then releases
that replica at the hub), so a request finishes on the revision it started with. A request for an evicted
adapter fetches it again like any version: from a peer that holds it or from the trainer.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import torch

from rlsync.core.events import FetchEvent
from rlsync.core.transforms import VariantReader, get_transform, specs_of
from rlsync.hub import errors as E

from .base import Side, WeightPublisher, WeightReceiver, WeightSync, register_weight_sync
from .engine import EngineCapsError, need
from .hub_derived import variant_misfit

log = logging.getLogger(__name__)

ADAPTER_BASE = "__rlsync_adapter_base__"
"""The tensor inside every adapter version holding its base version: immutable and checksummed with the adapter,
and there the moment the version commits (a record written after the commit would leave a window)."""


def adapter_model(model: str, tenant: str = "") -> str:
    """The hub model of adapters over `model`: `policy` -> `policy.lora`, tenant `a` -> `policy.lora.a`.

    Not `NAME@KIND` (hub/model/names.py): version v of a derived object is made from `NAME` v, while an adapter's
    version v is trained over whichever base version its `ADAPTER_BASE` names; to the hub it is a model of its own."""
    return f"{model}.lora" + (f".{tenant}" if tenant else "")


class HubAdapterPublisher(WeightPublisher):
    def __init__(self, side: Side, rank: int, *, digest: bool = False):
        super().__init__(side, rank, digest=digest)
        self.base_model, self.model = side.model, adapter_model(side.model)  # release() gives back adapters
        self.base_version: int | None = None
        self._base_record = torch.zeros(1, dtype=torch.int64)
        by_trainer = side.sync.variant != "none" and side.sync.variant_by == "trainer" and rank == 0
        self.deriver = VariantReader(self.hub, self.base_model, side.sync.variant) if by_trainer else None
        self._base_variant: dict | None = None  # the trainer's replica of the base's variant (kept: never rewritten)

    def publish(self, backend: Any) -> dict:
        v = backend.version
        tensors = backend.named_parameters_for_sync()
        self.meta = {k: (tuple(x.shape), x.dtype) for k, x in tensors.items()}
        n = sum(x.numel() * x.element_size() for x in tensors.values())
        if self.rank == 0:
            if self.base_version is None:  # once: the frozen base, as its own version
                base = backend.base_parameters_for_sync()
                self.hub.publish(self.base_model, v, base)
                self.base_version = v
                self._base_record[0] = v
                nb = sum(x.numel() * x.element_size() for x in base.values())
                self.clock.event("publish", version=v, bytes=nb, base=True)
                if self.deriver is not None:  # sync.variant_by=trainer: no engine takes the fp32 base
                    self._base_variant = self.deriver.publish_from(v, base).tensors
            self.hub.publish(self.model, v, {**tensors, ADAPTER_BASE: self._base_record})
            self.published = v
            self.clock.event("publish", version=v, bytes=n)
        return {"version": v, "bytes": n}

    def shapes(self, backend: Any) -> dict[str, tuple[int, ...]]:
        """The base's and the adapter's shapes: the driver's audit checks that neither travels through Ray."""
        both = {**backend.base_parameters_for_sync(), **backend.named_parameters_for_sync()}
        return {n: tuple(p.shape) for n, p in both.items()}

    def recover(self, into: dict) -> int:
        raise NotImplementedError("hub_adapter: an elastic trainer group is not supported with trainer.lora")


class HubAdapterReceiver(WeightReceiver):
    """An engine holding many adapters over one base: each adapter revision fetched into its own slot."""

    def __init__(self, side: Side, engine: Any, *, params: Any = None, delay_s: float = 0.0):
        super().__init__(side, engine, params=params, delay_s=delay_s)
        need(self.caps, type(self).__name__, "adapters")
        if self.sync.inflight:
            raise EngineCapsError("sync route hub_adapter: in-flight updates are not supported (sync.inflight=false)")
        self.base_model, self.adapter_model = side.model, adapter_model(side.model)
        self.slots = engine.enable_adapters(side.shape.lora(), self.sync.max_adapters,
                                            extra={ADAPTER_BASE: ((1,), torch.int64)}, merge=self.sync.merge_adapter)
        self.slots.on_evict = self._evicted
        self.base_version: int | None = None
        self.reader: VariantReader | None = None
        """sync.variant: the base's variant is read (or derived once) through this; None: the base as published."""
        if self.sync.variant != "none":
            specs = get_transform(self.sync.variant).specs(specs_of(self.slots.base_tensors()))
            self.slots.cast_base({n: dt for n, (_, dt) in specs.items()})
            # the fp32 scratch a derivation reads the base into is not kept: the base is derived once per run
            self.reader = VariantReader(self.hub, self.base_model, self.sync.variant, keep_scratch=False)
        self.base_held = self.reader.variant_model if self.reader else self.base_model
        """The hub model whose replica the engine's base tensors hold (`policy@bf16` with sync.variant=bf16)."""

    def _evicted(self, key) -> None:
        """An adapter leaves the engine: give its replica back (the hub reads it from others from now on)."""
        model, version = key
        self.hub.release(model, version)
        self.clock.event("adapter_evicted", model=model, version=version)

    def ensure(self, min_version: int, eager: bool = False) -> None:
        if self.engine.version >= min_version:
            if not eager:
                return
            latest = self.hub.latest(self.adapter_model)
            if latest is None or latest <= self.engine.version:
                return
        else:
            self._wait_for(min_version)
        self._take_latest()

    def _wait_for(self, min_version: int) -> None:
        with self.clock.state("waiting_weights"):
            if self.delay_s:
                time.sleep(self.delay_s)
            while (latest := self.hub.wait_latest(self.adapter_model, min_version, self.sync.wait_s)) is None \
                    or latest < min_version:
                log.info("still waiting for %s v%d (latest %s)", self.adapter_model, min_version, latest)

    def join(self) -> dict[str, int]:
        try:
            latest = self.hub.latest(self.adapter_model)
        except E.UnknownModelError:  # nothing published yet (the run is starting)
            latest = None
        return {} if latest is None else self._take_latest(join=True)

    def _take_latest(self, attempts: int = 8, join: bool = False) -> dict[str, int]:
        """Make the engine use the adapter's latest revision; a revision lost between `latest` and the read
        (the trainer stepped and every holder let it go) is asked for again."""
        for attempt in range(attempts):
            v = self.hub.latest(self.adapter_model)
            try:
                return self.take(self.adapter_model, v, join=join)
            except (E.VersionLostError, E.VersionNotRetainedError, E.TransferError) as e:
                self.clock.event("fetch_retry", error=type(e).__name__)
                log.info("fetch of %s v%d failed (%s); retrying (%d/%d)", self.adapter_model, v, e, attempt + 1,
                         attempts)
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
        raise RuntimeError(f"could not fetch {self.adapter_model!r} latest in {attempts} attempts")

    def take(self, model: str, version: int, *, use: bool = True, join: bool = False) -> dict[str, int]:
        """Make adapter (model, version) resident (fetched into a slot straight from the hub's replicas, with
        its base if the engine lacks it) and, with `use`, the one `generate` uses. Bytes by source."""
        key = (model, version)
        by: dict[str, int] = {}
        if not self.slots.has(key):
            name, into = self.slots.reserve(key)
            try:
                with self.clock.state("loading_weights"):
                    got = self.hub.fetch(model, version, into=into)
            except BaseException:
                self.slots.abandon(name)
                raise
            self.slots.commit(key, name)
            self._record(got, join)
            by.update(got.bytes_by_source)
            base = int(into[ADAPTER_BASE][0])
            if base != self.base_version:
                for src, n in self._take_base(base, join).items():
                    by[src] = by.get(src, 0) + n
        if use:
            self.engine.use_adapter(key, version)
        return by

    def _take_base(self, version: int, join: bool) -> dict[str, int]:
        if self.base_version is not None:  # the buffers are about to be overwritten: give the old base back
            self.hub.release(self.base_held, self.base_version)
        self.base_version = None
        with self.clock.state("loading_weights"):
            if self.reader is None:
                got = self.hub.fetch(self.base_model, version, into=self.slots.base_tensors())
            else:
                got = self.reader.fetch(version, into=self.slots.base_tensors())
        self.slots.base_written()
        self.base_version = version
        self._record(got, join)
        return dict(got.bytes_by_source)

    def _record(self, got, join: bool) -> None:
        ev = FetchEvent.from_result(got, wid=self.hub.worker_id, dc=self.hub.location.dc, join=join)
        self.clock.event(FetchEvent.NAME, **ev.attrs())


@register_weight_sync("hub_adapter")
class HubAdapter(WeightSync):
    """LoRA adapters as versions over a base version published once."""

    mode, order, adapters = "hub", 0, True
    publisher, receiver = HubAdapterPublisher, HubAdapterReceiver

    @classmethod
    def misfit(cls, sync, shape) -> str | None:
        if shape.backend != "torch":
            return "with trainer.lora needs trainer.backend=torch (peft on DeepSpeed is not supported here)"
        if shape.elastic_trainer:
            return "with trainer.lora does not support an elastic trainer group (trainer.elastic.enabled=false)"
        if sync.deltas or sync.inflight:
            return "with trainer.lora sends whole adapters (sync.deltas=false, sync.inflight=false)"
        if why := variant_misfit(sync):
            return why
        if sync.variant != "none" and not get_transform(sync.variant).same_layout:
            return (f"with trainer.lora: sync.variant={sync.variant} has its own tensor layout, which the adapter "
                    "engine (rollout.engine=hf) cannot start in; a bf16 base: sync.variant=bf16")
        return None
