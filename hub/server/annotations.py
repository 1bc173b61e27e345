"""The hub server's per-version annotations (a mixin of `HubServer`, hub/server/loop.py).

    hub.annotate("policy", 7, "probe", {"logprobs": [...]})   # journaled, then visible
    hub.annotations("policy", 7)                              # {"probe": {...}}

The state machine (hub/state/annotations.py) validates and keeps them; the journal makes them survive
a restart or failover onto the same journal, and forgets them with their version.
"""
from __future__ import annotations


class AnnotationOps:
    def _init_annotations(self) -> None:
        """Journal new annotations, and re-attach the journaled ones to the restored versions."""
        self.state.annotate_hook = self.journal.record_annotation
        for model, version, key, value in self.journal.load_annotations():
            self.state.restore_annotation(model, version, key, value)

    def op_annotate(self, ident, rid, model: str, version: int, key: str, value):
        return self.state.annotate(model, version, key, value)

    def op_annotations(self, ident, rid, model: str, version: int):
        return self.state.annotations(model, version)
