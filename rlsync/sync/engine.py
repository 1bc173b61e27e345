"""The engine side of the weights' path: what a receiver may ask of a rollout engine, and how it knows.

An engine declares `sync_caps`, an `EngineCaps` (rlsync/core/engine_caps.py: the rollout room imports it
from the low room, never this hub-facing one), and has the methods each capability names (`WeightEngine`).
Receivers (rlsync/sync/*.py) read the declaration; they never probe an engine for attributes:

    caps = caps_of(engine)                   # `hf`: EngineCaps(in_place_fetch=True, load_state=True)
    if caps.reads_hub:                       # vLLM: staged (k = 1) or TP-sliced (k > 1)
        engine.attach_hub(hub, "policy", layout=layout)
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol

from rlsync.core.engine_caps import EngineCaps

__all__ = ["EngineCaps", "EngineCapsError", "WeightEngine", "caps_of"]


class WeightEngine(Protocol):
    """A rollout engine as the weights' path sees it. `version` and `sync_caps` always; the methods of
    the capabilities it declares (an engine without a capability need not have its methods)."""

    version: int
    """The version the engine's weights are (-1: none yet)."""
    sync_caps: EngineCaps

    def named_parameters_for_sync(self) -> dict[str, Any]:
        """in_place_fetch: name -> live tensor (no copy); the hub fetches into these."""

    def load_state(self, tensors: Mapping[str, Any], version: int | None = None) -> None:
        """load_state: copy a whole version in from a mapping (checked first: all or nothing)."""

    def attach_hub(self, hub: Any, model: str, layout: Any = None, variant: str | None = None) -> None:
        """staged / tp_sliced: the engine reads `model` (its derived `variant`, if given) from this hub client itself."""

    def update_latest(self) -> Any:
        """staged / tp_sliced: take the hub's latest now (a `SyncStats`: fetch_s, apply_s, pause_s)."""

    def apply_staged(self) -> Any:
        """staged: apply a prefetched newer version if one is complete (a `SyncStats`), else None."""

    def prefetch_latest(self) -> bool:
        """staged: start fetching the hub's latest into staging when it is newer than the engine's."""

    def close(self) -> None:
        """staged / tp_sliced: stop reading from the hub."""

    def start_inflight(self, kv_policy: str) -> None:
        """inflight: from now on take staged versions at decode-step boundaries; `kv_policy` keep | recompute."""

    def stage_version(self, version: int) -> int | None:
        """inflight + staged: fetch `version` into staging and build it beside the live weights (blocking)."""

    def next_buffers(self) -> dict[str, Any]:
        """inflight + in_place_fetch: name -> the spare tensors the next version is fetched into."""

    def offer_next(self, version: int) -> None:
        """inflight + in_place_fetch: the spare buffers hold `version`, complete: switch at the next step boundary."""

    def switch_prepared(self) -> Any:
        """inflight: switch a prepared newer version in now, between calls (a `SyncStats`), else None."""

    def take_switches(self) -> list:
        """inflight: the switches made inside `generate` since the last call (`SyncStats`, in order)."""

    def weights_readback(self) -> dict[str, Any]:
        """verify: name -> the tensor the engine's forward reads now (after any conversion), no copy."""

    def probe_logprobs(self, tokens: list[int]) -> list[float]:
        """verify: log p(tokens[t] | tokens[:t]), t >= 1, at temperature 1, with the weights held now."""

    def verify_source(self) -> tuple[Any, dict]:
        """verify + reads_hub: (manifest, staged tensors, or the digests `verify_ahead` made) of the version last applied."""

    def verify_ahead(self, expect: Any) -> None:
        """verify + staged: call `expect(manifest, staging, recheck)` as each prefetched version lands; keep it for `verify_source`."""

    def reapply(self, version: int) -> None:
        """verify + reads_hub: fetch `version` again from another replica and apply it."""

    def staging_held(self) -> Any:
        """verify + reads_hub: a context in which nothing refills the staging `verify_source` returned."""

    def readback_done(self, version: int) -> None:
        """verify + reads_hub: a weights check has finished reading `version` back (its read-back may alias a
        staging the engine then holds off refilling until this call)."""

    def enable_adapters(self, cfg: Any, max_resident: int, extra: dict | None = None) -> Any:
        """adapters: LoRA slots over the base from now on; the `AdapterSlots` (rollout/adapters.py)."""

    def use_adapter(self, key: Any, version: int) -> None:
        """adapters: generate with resident adapter `key`; the engine's version becomes `version`."""


METHODS = {"in_place_fetch": ("named_parameters_for_sync",), "load_state": ("load_state",),
           "staged": ("attach_hub", "update_latest", "apply_staged", "prefetch_latest", "close"),
           "tp_sliced": ("attach_hub", "update_latest", "close"),
           "inflight": ("start_inflight", "switch_prepared", "take_switches"),
           "verify": ("weights_readback", "probe_logprobs"),
           "adapters": ("enable_adapters", "use_adapter")}
"""The methods each capability promises."""
INFLIGHT_WITH = {"staged": ("stage_version",), "in_place_fetch": ("next_buffers", "offer_next")}
"""What an in-flight engine adds for the way weights reach it."""
VERIFY_WITH = ("verify_source", "reapply", "staging_held", "verify_ahead", "readback_done")
"""What a verifiable engine that reads the hub itself adds (the receiver has no staging of its own)."""


class EngineCapsError(TypeError):
    """An engine that declares no `sync_caps`, lacks a method its capabilities promise, or lacks the
    capability a route needs."""


def caps_of(engine: Any) -> EngineCaps:
    """The engine's declared `EngineCaps`, checked against its methods."""
    caps = getattr(engine, "sync_caps", None)
    if not isinstance(caps, EngineCaps):
        raise EngineCapsError(f"{type(engine).__name__} declares no `sync_caps` (an EngineCaps from rollout/engine.py, "
                              "e.g. EngineCaps(in_place_fetch=True, load_state=True)): how should weights reach it?")
    promised = [m for cap, ms in METHODS.items() if getattr(caps, cap) for m in ms]
    if caps.inflight:
        promised += [m for cap, ms in INFLIGHT_WITH.items() if getattr(caps, cap) for m in ms]
    if caps.verify and caps.reads_hub:
        promised += list(VERIFY_WITH)
    missing = sorted({m for m in promised if not callable(getattr(engine, m, None))})
    if missing:
        raise EngineCapsError(f"{type(engine).__name__} declares {caps} but has no {', '.join(missing)}")
    return caps


def need(caps: EngineCaps, route: str, *any_of: str) -> None:
    """Refuse an engine that has none of the capabilities `any_of` the route `route` needs."""
    if not any(getattr(caps, c) for c in any_of):
        raise EngineCapsError(f"sync route {route} needs an engine with {' or '.join(any_of)}; this one declares {caps}")
