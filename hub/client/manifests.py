"""The manifests a client has from its fetch plans, so the hub need not send one twice.

A plan reply names its manifest by digest (`manifest_digest`) when the fetch named the manifests the
reader has (`have_manifests`), and carries the manifest itself only when it is not one of them. The
cache is small and bounded (the newest `size` manifests this client was sent): a reader fetches the
newest version or a few before it, and an evicted manifest is simply sent again.

    have = cache.have(model, shard)                         # {digest: Manifest}, a snapshot
    plan = call("fetch", ..., have_manifests=list(have))
    manifest = cache.take(plan, have, model, shard)         # from the reply, or from the snapshot
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from rlsync.hub import errors as E
from rlsync.hub.model.manifest import Manifest
from rlsync.hub.protocol.messages import FetchPlan
from rlsync.hub.model.shard import Shard


class ManifestCache:
    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._by_digest: OrderedDict[str, tuple[str, str, Manifest]] = OrderedDict()

    def have(self, model: str, shard: Shard) -> dict[str, Manifest]:
        """The cached manifests of (model, shard), by digest: what a fetch of it may say it has."""
        with self._lock:
            return {d: m for d, (mo, sk, m) in self._by_digest.items() if mo == model and sk == shard.key}

    def take(self, plan: FetchPlan, have: dict[str, Manifest], model: str, shard: Shard) -> Manifest:
        """The plan's manifest: decoded from the reply (and cached under its digest) or the cached one."""
        digest = plan.manifest_digest
        if plan.manifest is not None:
            m = Manifest.from_wire(plan.manifest)
            if isinstance(digest, str):
                with self._lock:
                    self._by_digest[digest] = (model, shard.key, m)
                    self._by_digest.move_to_end(digest)
                    while len(self._by_digest) > self.size:
                        self._by_digest.popitem(last=False)
            return m
        m = have.get(digest) if isinstance(digest, str) else None
        if m is None:
            raise E.ProtocolError(f"the hub left out manifest {digest!r}, which this reader did not say it has")
        with self._lock:
            if digest in self._by_digest:
                self._by_digest.move_to_end(digest)
        return m
