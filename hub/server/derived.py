"""The hub server's variant operations (a mixin of `HubServer`, hub/server/loop.py): `derive` (make it, or
fetch it; parked while another worker derives it), `derive_abandon`, `derived_from` (the record).

A parked `derive` is the state's `DerivationPending` (a `HolderSilentError`): the server's ordinary parking
retries it each loop pass, so it is answered in the pass that publishes the variant or ends its lease (the
holder expires, leaves or abandons), or, at the caller's try time, with HolderWaitTimeoutError (it asks again).
"""
from __future__ import annotations

from rlsync.hub.model.shard import Shard


class DerivedOps:
    def op_derive(self, ident, rid, wid: str, model: str, version, transform: str, shard: Shard,
                  params: dict | None = None):
        return self.state.derive(wid, model, version, transform, shard, params)

    def op_derive_abandon(self, ident, rid, wid: str, model: str, version: int, shard: Shard):
        return self.state.derive_abandon(wid, model, version, shard)

    def op_derived_from(self, ident, rid, model: str, version: int):
        return self.state.derived_from(model, version)
