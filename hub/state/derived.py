"""HubState's derived-variant protocol: who makes variant X of version v, and the record of what it was made from.

A mixin of `HubState` (hub/state/__init__.py). A variant (`policy@bf16` v, hub/model/names.py) is an ordinary
version of its own model once published: its replicas, fetch plans (pipelined through relays), retention and
deltas are the ordinary tables. What is its own:

- the *derived-from record* on its `VersionRec` (base model, base version, transform name and parameters);
- the *single-deriver rule*: `derive` gives the first reader that needs (variant, v) a lease to make and
  publish it; while the lease's holder lives, every other reader is told to wait (the server parks its call)
  and, once the variant is published, to fetch it from its holders like any version. A lease ends when its
  holder publishes the variant, gives it up (`derive_abandon`), leaves or expires; the next caller then gets it.

Leases are soft state: a restarted hub has none, and the first reader to ask derives again (the transform is
deterministic: the bytes, hence the manifest, are the committed ones, which the publish checks).
"""
from __future__ import annotations

from dataclasses import dataclass

from rlsync.hub import errors as E
from rlsync.hub.model.names import DELTA, DerivedName, derived_model, is_kind
from rlsync.hub.model.shard import Shard
from rlsync.hub.state.records import HolderSilentError


@dataclass(slots=True)
class Lease:
    worker: str
    params: dict
    since: float


class DerivationPending(HolderSilentError):
    """Not an answer: another worker holds the lease for this variant; the server parks the call until it is
    published (then: fetch it) or the lease ends (then: this caller derives), within the caller's try time."""


class Derivations:
    """`derive`, `derive_abandon`, `derived_from`; `_variant_published` runs inside `publish`."""

    def derive(self, wid: str, model: str, version, kind: str, shard: Shard, params: dict | None = None) -> dict:
        """{"mode": "derive" | "fetch", "model": variant model, "version": v}: make it (this worker holds the
        lease now) or fetch it (it is published and held). DerivationPending while another worker derives it."""
        self.touch(wid)
        if not is_kind(kind) or kind == DELTA:
            raise E.InvalidArgumentError(f"derive: transform {kind!r} is not a variant kind (lowercase letters, "
                                         f"digits, '_'; deltas have their own calls: publish_delta / fetch_delta)")
        if DerivedName.parse(model) is not None and DerivedName.parse(model).kind == DELTA:
            raise E.InvalidArgumentError(f"derive: {model!r} is a delta model; derive variants of a version")
        m = self.model(model)
        ver = self.resolve_version(m, model, version)
        if not m.versions[ver].committed:
            raise E.VersionNotFoundError(f"{model!r} v{ver} is not committed: a variant is made from a committed version")
        self.shard_manifest(m, model, ver, shard)  # the reader's group is the version's (ShardError if not)
        dm = derived_model(model, kind)
        params = dict(params or {})
        d = self.models.get(dm)
        dv = d.versions.get(ver) if d is not None else None
        if dv is not None and dv.derived_from is not None and dv.derived_from["params"] not in (None, params):
            raise E.InvalidArgumentError(f"derive: {dm!r} v{ver} was derived with {dv.derived_from['params']}; "
                                         f"this reader's transform says {params}: one name, one transform")
        if dv is not None and dv.committed and self._index.shard_replicas.get((dm, ver, shard.key)):
            return {"mode": "fetch", "model": dm, "version": ver}
        key = (dm, ver, shard.key)
        lease = self.leases.get(key)
        if lease is not None and lease.worker in self.workers:  # a lease of a worker gone has ended
            if lease.params != params:
                raise E.InvalidArgumentError(f"derive: {dm!r} v{ver} is being derived with {lease.params}; "
                                             f"this reader's transform says {params}: one name, one transform")
            if lease.worker != wid:
                raise DerivationPending(f"{dm!r} v{ver} is being derived by {lease.worker}")
        self.leases[key] = Lease(wid, params, self.clock())
        return {"mode": "derive", "model": dm, "version": ver}

    def derive_abandon(self, wid: str, model: str, version: int, shard: Shard) -> bool:
        """The lease holder gives up (its derivation failed): the next caller derives. False if not its lease."""
        self.touch(wid)
        key = (model, version, shard.key)
        lease = self.leases.get(key)
        if lease is None or lease.worker != wid:
            return False
        del self.leases[key]
        return True

    def derived_from(self, model: str, version: int) -> dict:
        """The record of variant `model` v: {"model", "version", "transform", "params"} (params None when
        the variant was published without a lease: a trainer deriving by config, or a journal restore)."""
        m = self.model(model)
        v = m.versions.get(version)
        if DerivedName.parse(model) is None or v is None or not v.committed:
            raise E.VersionNotFoundError(f"{model!r} v{version} is not a committed derived version")
        return v.derived_from or self._record(model, version, None)

    @staticmethod
    def _record(model: str, version: int, params: dict | None) -> dict:
        d = DerivedName.parse(model)
        return {"model": d.base, "version": version, "transform": d.kind, "params": params}

    def _check_variant(self, dm: str, version: int) -> None:
        """A variant of X v is published once X v has committed (typed refusal, nothing changed). A hub that
        has never seen X (a peer DC following only the variant: its federation gateway publishes what the
        home hub committed, byte for byte) takes the variant as it takes any version."""
        base = DerivedName.parse(dm).base
        x = self.models.get(base)
        if x is None:
            return
        xv = x.versions.get(version)
        if xv is None or not xv.committed:
            raise E.VersionNotFoundError(f"{dm!r} v{version}: its base {base!r} v{version} is not committed; "
                                         "a variant is derived from a committed version")

    def _variant_published(self, wid: str, dm: str, version: int, shard: Shard, v) -> None:
        lease = self.leases.get((dm, version, shard.key))
        if v.derived_from is None:
            v.derived_from = self._record(dm, version, lease.params if lease is not None else None)
        if lease is not None and (lease.worker == wid or v.committed):
            del self.leases[(dm, version, shard.key)]
