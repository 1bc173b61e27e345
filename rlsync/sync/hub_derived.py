"""`sync.mode=hub` with `sync.variant=bf16|int8`: engines read a derived variant of each version (docs/derived.md).

    publisher: as hub_full (the trainer publishes its live fp32 tensors); with `sync.variant_by=trainer` rank 0
               then derives the variant from them and publishes it too (no engine takes the fp32 version)
    receiver:  the first engine to need variant X of v gets the hub's lease, fetches v, applies the registered
               transform (rlsync/core/transforms.py) and publishes `model@X` v; every other engine is planned
               from it (or from a relay of it) like any version. An engine that reads the hub itself (vLLM)
               gets the variant name with the hub client (`attach_hub(variant=...)`): its stage does the same
               into its host staging, and a bf16 variant applies into bf16 kernels with no converting copy.

Needs an engine whose buffers have the variant's dtypes (`named_parameters_for_sync` in bf16 for `bf16`), or
one that reads the hub itself. A variant with its own tensor layout (`int8`: `*.weight_scale` beside int8
weights) needs an engine started in that layout: the worker builds it so (`engine_variant`: a vLLM engine from
the int8 W8A8 checkpoint of the model directory) and the receiver refuses any other (`EngineCaps.layout_variant`).
Not composed here: deltas (`sync.deltas`; the hub can carry a variant's delta, this route does not publish them)
and ZeRO-3 sharded publishing.
"""
from __future__ import annotations

from rlsync.core.transforms import VariantReader, get_transform, transform_names

from .base import SyncModeError, WeightSync, register_weight_sync
from .engine import caps_of
from .hub_full import HubFullPublisher, HubReceiver


STARTS_IN_VARIANT = ("vllm",)
"""Rollout engines whose factory takes `variant=` and starts from that variant's checkpoint (rl_engine.py)."""


def variant_misfit(sync) -> str | None:
    """Why `sync.variant` / `sync.variant_by` name nothing a route can read (None: they do, or no variant)."""
    if sync.variant == "none":
        return None
    if sync.variant not in transform_names():
        return f"sync.variant={sync.variant!r}: known variants {', '.join(transform_names())} (or none)"
    if sync.variant_by not in ("engine", "trainer"):
        return f"sync.variant_by={sync.variant_by!r}: engine or trainer"
    return None


class HubDerivedPublisher(HubFullPublisher):
    def __init__(self, side, rank: int, *, digest: bool = False):
        super().__init__(side, rank, digest=digest)
        by_trainer = side.sync.variant_by == "trainer" and self.hub is not None and rank == 0
        self.deriver = VariantReader(self.hub, self.model, side.sync.variant) if by_trainer else None
        self._variant: dict | None = None  # the variant's buffers, reused (the last one is released first)

    def _publish(self, version: int, live: dict) -> None:
        super()._publish(version, live)
        if self.deriver is not None:
            self._variant = self.deriver.publish_from(version, live, into=self._variant).tensors


class HubDerivedReceiver(HubReceiver):
    def __init__(self, side, engine, *, params=None, delay_s: float = 0.0):
        self.variant = side.sync.variant  # read by attach_hub in the base constructor
        started = caps_of(engine).layout_variant
        if not get_transform(self.variant).same_layout and started != self.variant:
            had = f"the {started} variant's" if started else "the model's own"
            raise SyncModeError(f"sync.variant={self.variant}: this {type(engine).__name__} was started in {had} "
                                f"layout, not the {self.variant} variant's (rollout.engine=vllm starts from its "
                                "checkpoint); nothing was read", key="sync.variant")
        super().__init__(side, engine, params=params, delay_s=delay_s)
        self.reader = VariantReader(self.hub, self.model, self.variant)

    def _attach(self) -> None:
        self.engine.attach_hub(self.hub, self.model, layout=self.layout, variant=self.variant)

    def _held_dtype(self):
        return None  # the engine holds the variant's own dtypes (int8 weights, fp32 scales): its checksums apply

    def _read(self):
        if self.caps.reads_hub:
            return self.engine.update_latest()
        # fetch_variant releases what the engine's buffers held (a replica of the last variant) before writing
        return self.reader.fetch("latest", into=self.engine.named_parameters_for_sync())

    @property
    def conversion_s(self) -> float:
        """CPU seconds this engine spent deriving variants (others read them from it)."""
        return self.reader.conversion_s


@register_weight_sync("hub_derived")
class HubDerived(WeightSync):
    """Whole versions' derived variants through the hub: made once, read from peers."""

    mode, order = "hub", 3  # after hub_delta and hub_full (which refuse a variant): its refusal is the one shown
    publisher, receiver = HubDerivedPublisher, HubDerivedReceiver

    @classmethod
    def misfit(cls, sync, shape) -> str | None:
        if sync.variant == "none":
            return "needs sync.variant (bf16|int8)"
        if why := variant_misfit(sync):
            return why
        if sync.deltas:
            return "with sync.variant: deltas of a variant are not published by this route (sync.deltas=false)"
        if not get_transform(sync.variant).same_layout and shape.rollout_engine not in STARTS_IN_VARIANT:
            return (f"sync.variant={sync.variant}: rollout.engine={shape.rollout_engine} cannot start in that variant's "
                    f"layout (rollout.engine={'|'.join(STARTS_IN_VARIANT)} starts from its checkpoint); use "
                    "sync.variant=bf16")
        return None

    @classmethod
    def engine_variant(cls, sync) -> str | None:
        """A variant with its own layout (`int8`): every engine starts from its checkpoint (then takes it in place)."""
        return None if get_transform(sync.variant).same_layout else sync.variant
