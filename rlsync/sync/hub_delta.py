"""`sync.mode=hub` with `sync.deltas=true`: whole versions plus each version's lossless delta from the last.

    publisher: rank 0 `hub.publish_delta(model, v, live)` (one host copy of the weights, an encode per
               step), committed before v itself, so an engine that sees v finds its delta
    receiver:  an engine holding some version takes `hub.fetch_delta(model, "latest", fallback=True)`: the
               chain of deltas onto what it holds when the hub says that is cheaper, else the full version
               (docs/deltas.md). Engines that read the hub themselves (vLLM) take whole versions.
"""
from __future__ import annotations

from .base import WeightSync, register_weight_sync
from .hub_full import HubFullPublisher, HubReceiver


class HubDeltaPublisher(HubFullPublisher):
    def _publish(self, version: int, live: dict) -> None:
        self.hub.publish_delta(self.model, version, live)  # v's delta from the last version (a copy is kept here)
        super()._publish(version, live)


class HubDeltaReceiver(HubReceiver):
    def _read(self):
        if not self.caps.reads_hub and self.engine.version >= 0:  # the held version stays until v is built
            return self.hub.fetch_delta(self.model, "latest", into=self.engine.named_parameters_for_sync(),
                                        fallback=True)
        return super()._read()


@register_weight_sync("hub_delta")
class HubDelta(WeightSync):
    """Whole versions and their deltas through the hub."""

    mode, order = "hub", 1
    publisher, receiver = HubDeltaPublisher, HubDeltaReceiver

    @classmethod
    def misfit(cls, sync, shape) -> str | None:
        if sync.variant != "none":
            return "publishes no variant's deltas (sync.variant with sync.deltas: not composed)"
        return None if sync.deltas else "needs sync.deltas=true"
