"""HubState's per-version annotations: small opaque values attached to a committed version. No I/O.

A mixin of `HubState` (hub/state/__init__.py). The hub does not interpret them (a trainer's probe
log-probs, a derived variant's note): it keeps them with the version's record, journals them through
`annotate_hook` before they become visible (so a restarted hub has them), and drops them when the
version is forgotten. A key is written once: writing the same value again is a no-op (a retried call),
another value is refused, as a version's bytes are immutable.

    state.annotate("policy", 7, "probe", {"logprobs": [-1.2, -0.4]})
    state.annotations("policy", 7)            # {"probe": {"logprobs": [-1.2, -0.4]}}
"""
from __future__ import annotations

from rlsync.hub import errors as E
from rlsync.hub.state.records import VersionRec

MAX_ANNOTATIONS = 64
"""Keys per version: annotations are notes, not a store (each value is capped on the wire too)."""


class Annotations:
    def _annotated(self, model: str, version: int) -> VersionRec:
        v = self.model(model).versions.get(version)
        if v is None or not v.committed:
            raise E.VersionNotFoundError(f"{model!r} v{version} is not a committed version this hub keeps "
                                         "(annotate a version after it commits, before it is forgotten)")
        return v

    def annotate(self, model: str, version: int, key: str, value) -> bool:
        """Attach `value` under `key` to committed (model, version). True if new, False if already there."""
        v = self._annotated(model, version)
        if key in v.annotations:
            if v.annotations[key] != value:
                raise E.VersionError(f"{model!r} v{version} annotation {key!r} is already set to another value: "
                                     "an annotation is written once (use a new key)")
            return False
        if len(v.annotations) >= MAX_ANNOTATIONS:
            raise E.InvalidArgumentError(f"{model!r} v{version} has {MAX_ANNOTATIONS} annotations, the most a "
                                         "version keeps: put related values under one key")
        if self.annotate_hook is not None:
            self.annotate_hook(model, version, key, value)
        v.annotations[key] = value
        return True

    def annotations(self, model: str, version: int) -> dict:
        return dict(self._annotated(model, version).annotations)

    def restore_annotation(self, model: str, version: int, key: str, value) -> None:
        """Re-attach a journaled annotation (restart); one of a version the journal forgot is skipped."""
        m = self.models.get(model)
        v = m.versions.get(version) if m is not None else None
        if v is not None:
            v.annotations[key] = value
