"""HubState's version protocol: publish (commit through the journal hook), restore, re-register. No I/O.

A mixin of `HubState` (hub/state/__init__.py). A version commits when its last shard of the tp×pp group is
published; the `commit_hook` (the journal) runs before the commit becomes visible.
"""
from __future__ import annotations

import logging

from rlsync.hub import errors as E
from rlsync.hub.state import retention
from rlsync.hub.delta.plan import delta_base
from rlsync.hub.model.names import DerivedName, base_model, delta_model, is_delta_model, is_variant_model
from rlsync.hub.model.manifest import Manifest
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.names import LAYOUT_DIGEST
from rlsync.hub.model.shard import Shard
from rlsync.hub.state.records import ModelRec, ReplicaRec, VersionRec

log = logging.getLogger("rlsync.hub.state")


class Versions:
    """Publish, commit, forget old manifests, restore from the journal, re-register replicas."""

    def publish(self, wid: str, model: str, version: int, shard: Shard, manifest: Manifest,
                home: str | None = None) -> bool:
        """Register `wid`'s live tensors as a full replica of (model, version, shard). True if it committed.
        `home`: a federation gateway's publish, the id of the model's home hub (hub/state/homes.py)."""
        self.touch(wid)
        self.check_home(wid, model, home)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise E.VersionError(f"version must be a non-negative int, got {version!r}")
        m = self.models.get(model)
        # a variant is derived from any committed version, in any order, and again by a later deriver once
        # nobody holds it (same bytes: the manifest check below): only its base's order matters
        variant = is_variant_model(model)
        if m is not None and m.latest is not None and version <= m.latest and not variant:
            raise E.VersionError(f"{model!r} version {version} <= latest committed {m.latest}: "
                                 "versions are immutable and strictly increasing")
        delta = is_delta_model(model)
        if delta:
            self._check_delta(wid, model, version, shard, delta_base(manifest))
        elif variant:
            self._check_variant(model, version)
        v = m.versions.get(version) if m else None
        rid = ReplicaId(wid, model, version, shard.key).wire
        if rid in self.replicas:
            raise E.VersionError(f"{model!r} v{version} {shard.key} already published by this worker")
        replaced: list[str] = []  # a pending delta of this shard by another worker, replaced by this one
        if v is not None:
            if v.group != shard.group:
                raise E.ShardError(f"{model!r} v{version} has group tp×pp={v.group}; this shard says {shard.group}")
            same = v.manifests.get(shard.key)
            if delta and same is not None and same != manifest and not v.committed:
                replaced = [r.id for r in self.replicas_of(model, version, shard.key) if r.worker != wid]
            if same is not None and same != manifest and not replaced:
                raise E.ManifestMismatchError(
                    f"{model!r} v{version} {shard.key} was published with a different manifest "
                    "(other bytes or layout): a version is immutable")
            for key, other in v.manifests.items():
                if key.split("-")[1] == shard.key.split("-")[1] and key != shard.key:
                    a = [(t.name, t.dtype) for t in other.tensors]
                    b = [(t.name, t.dtype) for t in manifest.tensors]
                    if a != b:
                        _same_layout(model, version, (shard.key, manifest), (key, other))
                        raise E.ManifestMismatchError(
                            f"{model!r} v{version}: shard {shard.key}'s tensors (names/dtypes) disagree "
                            f"with shard {key} of the same pipeline stage")
        others = set(v.manifests) - {shard.key} if v is not None else set()
        commits = len(others) + 1 == shard.group_count and (v is None or shard.key not in v.manifests or replaced)
        if delta and commits:  # a delta becomes visible with the version it leads to, never before it
            x = self.models[base_model(model)].versions.get(version)
            commits = x is not None and x.committed
        if commits and self.commit_hook is not None:
            manifests = dict(v.manifests) if v else {}
            manifests[shard.key] = manifest
            self.commit_hook(model, version, shard.group, {k: x.to_wire() for k, x in manifests.items()})
        if home is not None:
            self.record_home(model, home)  # journaled first (home_hook), like the commit
        # -- validated (and journaled if committing): mutate
        if m is None:
            m = self.models[model] = ModelRec(model)
        if v is None:
            v = m.versions[version] = VersionRec(version, shard.group)
        for other in replaced:
            log.warning("%s v%d %s: a pending delta by %s is replaced by %s's", model, version, shard.key,
                        self.replicas[other].worker, wid)
            del self.replicas[other]
        v.manifests[shard.key] = manifest
        self.replicas[rid] = ReplicaRec(rid, wid, model, version, shard.key, "live", True, origin=True)
        if commits:
            self._mark_committed(m, v)
            if not delta:
                self._commit_pending_delta(model, version)
        if variant:
            self._variant_published(wid, model, version, shard, v)
        return commits

    def _mark_committed(self, m: ModelRec, v) -> None:
        v.committed = True
        m.committed.append(v.version)
        m.committed.sort()
        self._release_events.model(m.name)  # older versions may leave retention (its variants' too)
        for name in self.models:
            d = DerivedName.parse(name)
            if d is not None and d.base == m.name and d.kind != "delta":
                self._release_events.model(name)
        log.info("committed %s v%d (%d shard%s)", m.name, v.version, v.group[0] * v.group[1],
                 "s" if v.group != (1, 1) else "")
        self._forget_old(m)

    def _check_delta(self, wid: str, dm: str, version: int, shard: Shard, base: int) -> None:
        """A delta object (v_base -> v) of model X is published by X v's publisher: before X v (the
        version about to be published: v > X's latest) or after it (this worker published X v's
        shard). Its base is a committed version of X below v. Typed refusals, nothing changed."""
        x = self.models.get(base_model(dm))
        xb = x.versions.get(base) if x is not None else None
        if xb is None or not xb.committed or base >= version:
            raise E.VersionNotFoundError(f"{dm!r} v{version}: its base {base_model(dm)!r} v{base} is not a "
                                         "committed version below it")
        if x.latest is not None and version <= x.latest:
            own = self.replicas.get(ReplicaId(wid, base_model(dm), version, shard.key).wire)
            if own is None or not own.origin:
                raise E.VersionError(f"{dm!r} v{version}: {base_model(dm)!r} is at v{x.latest}; a delta is "
                                     f"published for the version about to be published, or by v{version}'s publisher")

    def _commit_pending_delta(self, model: str, version: int) -> None:
        """X v just committed: its delta object, published before it, commits now — only the shards that
        X v's own publishers published (a delta by anyone else leads to other bytes: dropped)."""
        dm = self.models.get(delta_model(model))
        dv = dm.versions.get(version) if dm is not None else None
        if dv is None or dv.committed:
            return
        for key in list(dv.manifests):
            mine = {r.worker for r in self.replicas_of(model, version, key) if r.origin}
            for r in self.replicas_of(dm.name, version, key):
                if r.worker not in mine:
                    log.warning("%s v%d %s: dropped a delta by %s, who did not publish %s v%d", dm.name, version,
                                key, r.worker, model, version)
                    del self.replicas[r.id]
            if not self.replicas_of(dm.name, version, key):
                del dv.manifests[key]
        if len(dv.manifests) != dv.group[0] * dv.group[1]:
            return
        if self.commit_hook is not None:
            try:
                self.commit_hook(dm.name, version, dv.group, {k: x.to_wire() for k, x in dv.manifests.items()})
            except Exception as e:  # noqa: BLE001 - the version committed; its delta is optional
                log.warning("%s v%d: journaling its delta failed (%s): readers take it in full", dm.name, version, e)
                return
        self._mark_committed(dm, dv)

    def held_versions(self, model: str) -> list[int]:
        """Committed versions of `model` of which every shard has a full replica now, ascending (an
        uncommitted version, or one a shard of which nobody holds, cannot be read in full)."""
        m = self.models.get(model)
        if m is None:
            return []
        have = self._index.shard_replicas
        return [v for v in m.committed if all(
            any(self.replicas[r].full for r in have.get((model, v, key), ())) for key in m.versions[v].manifests)]

    def _forget_old(self, m: ModelRec) -> None:
        below = retention.forget_below(m.latest, self.policy(m.name).retention.cfg.retain_last)
        if not m.versions or min(m.versions) >= below:
            return
        idx = self._index
        used = (set(idx.replica_versions.get(m.name, ())) | {p.version for p in m.pins.values()}
                | set(idx.fetch_versions.get(m.name, ())))
        for v in retention.forgettable(list(m.versions), below, used):
            del m.versions[v]
        m.committed = [v for v in m.committed if v in m.versions]
        m.forgot_below = below
        self._release_events.model(m.name)

    def restore_committed(self, model: str, version: int, group: tuple[int, int],
                          manifests: dict[str, Manifest]) -> None:
        """Re-create a committed version from the journal (no replicas: workers re-register them)."""
        m = self.models.setdefault(model, ModelRec(model))
        m.versions[version] = VersionRec(version, group, dict(manifests), True)
        if version not in m.committed:
            m.committed.append(version)
            m.committed.sort()
            self._release_events.model(model)

    def register_replica(self, wid: str, model: str, version: int, shard: Shard, slot: str,
                         manifest: Manifest, origin: bool = False) -> str:
        """A worker (re)announces a full replica of a committed version: seeds, and re-registration.

        `origin`: a live replica its publisher re-registers after a hub restart (the new hub would
        otherwise take the trainer's copy for a reader's, and let it go with one other copy)."""
        self.touch(wid)
        m = self.model(model)
        v = m.versions.get(version)
        if v is None or not v.committed:
            raise E.VersionNotFoundError(f"{model!r} v{version} is not committed")
        if v.manifests.get(shard.key) != manifest:
            raise E.ManifestMismatchError(f"{model!r} v{version} {shard.key}: manifest differs from the committed one")
        if slot not in ("live", "seed"):
            raise E.ProtocolError(f"unknown replica slot {slot!r}")
        rid = ReplicaId(wid, model, version, shard.key, slot).wire
        live = self.replicas.get(ReplicaId(wid, model, version, shard.key).wire)
        origin = (origin and slot == "live") or (slot == "seed" and live is not None and live.origin)
        rec = self.replicas.setdefault(rid, ReplicaRec(rid, wid, model, version, shard.key, slot, True, origin=origin))
        if not rec.full:
            # The worker holds it complete (it registers nothing else): a fetch of it this hub still has
            # open lost its fetch_done (restart, retry). Without this its release would be refused.
            for fid in self._relay_fetches(rid):
                del self.fetches[fid]
            rec.full = True
            self._release_events.shard(model, version, shard.key)
        return rid


def _same_layout(model: str, version: int, mine: tuple[str, Manifest], theirs: tuple[str, Manifest]) -> None:
    """LayoutError if two shards of a version carry different sharded layouts (hub/reshard/layout.py names an
    empty tensor of each shard by its layout's digest): their pieces may leave gaps or overlap."""
    (ka, a), (kb, b) = mine, theirs
    da = [t.name[len(LAYOUT_DIGEST):] for t in a.tensors if t.name.startswith(LAYOUT_DIGEST)]
    db = [t.name[len(LAYOUT_DIGEST):] for t in b.tensors if t.name.startswith(LAYOUT_DIGEST)]
    if da != db:
        raise E.LayoutError(f"{model!r} v{version}: shard {ka} was published with layout {da or 'none'}, shard "
                            f"{kb} with {db or 'none'}: every rank of a version must publish the same "
                            "ShardedLayout (built from the same shapes, dtypes and world)")
