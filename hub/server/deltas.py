"""The hub server's delta operations (a mixin of `HubServer`, hub/server/loop.py): a delta reader's choice
(`delta_choose`) and its last word on a version (`applied`). Both are on a remote reader's path once
per version, so their replies are what crosses a DC link per reader: kept to what the reader acts on."""
from __future__ import annotations

import time

from rlsync.hub import errors as E
from rlsync.hub.delta.plan import compact_plan, compact_wire
from rlsync.hub.model.names import delta_model
from rlsync.hub.model.shard import Shard


class DeltaOps:
    def op_delta_choose(self, ident, rid, wid: str, model: str, version, shard: Shard, base: int, into_spec=None,
                        explain: bool = False):
        """Full or a delta chain; for a chain, v's manifest by digest (the reader rebuilds it from the
        layout it holds and the checksums in the last delta's frames) and the plan of the chain's first
        delta (manifest in `delta_plan.compact_wire`): one round trip across the link, not two."""
        t0 = time.perf_counter()
        choice = self.state.choose_update(wid, model, version, shard, base, into_spec)
        # What the reader acts on; the estimates behind the choice (bytes, seconds) only with `explain`.
        out = {k: choice[k] for k in (("mode", "version", "chain") if not explain else choice) if k != "manifest"}
        out["manifest_digest"] = self._manifest_bytes.entry(choice["manifest"])[1]
        if out["mode"] == "delta":
            try:
                plan = self.state.plan_fetch(wid, delta_model(model), out["chain"][0], shard)
            except E.HubError:  # e.g. no holder right now: the reader's own fetch parks / re-plans it
                return out
            if not plan.held:
                out["plan"] = compact_plan(self._plan_fields(wid, plan), model, shard) | \
                    {"compact_manifest": compact_wire(plan.manifest)}
                self.load.plan_done(time.perf_counter() - t0)
        return out

    def op_applied(self, ident, rid, wid: str, model: str, version: int, shard: Shard, manifest_digest: str,
                   done: list, release_deltas: list = ()):
        """A delta reader's last word on a version, one round trip instead of 1 + len(done): it holds v
        (register a live replica; the manifest is v's own, named by the digest `delta_choose` sent) and
        finished the fetches `done` (each closed as `fetch_done(ok=True)`: those relays are full
        replicas now), and releases the delta objects of versions `release_deltas` that need nothing
        more (no reader in flight, not needed by retention: a release that would wait or seed is left
        pending for the reader's own `release`). Checked before anything changes; answers [the fetch
        ids the hub did not know (it restarted meanwhile: the reader registers those replicas
        itself), the delta versions released]."""
        self.state.touch(wid)
        mr = self.state.model(model)
        m = self.state.shard_manifest(mr, model, self.state.resolve_version(mr, model, version), shard)
        if self._manifest_bytes.entry(m)[1] != manifest_digest:
            raise E.ManifestMismatchError(f"{model!r} v{version} {shard.key}: manifest digest differs from the committed one")
        self.state.register_replica(wid, model, version, shard, "live", m)
        unknown, released = [], []
        for fid in done:
            try:
                self.state.fetch_done(wid, fid, True)
            except E.UnknownFetchError:
                unknown.append(fid)
        for dv in release_deltas:  # old delta objects: released here only when nothing more is needed
            if self.state.release_if_free(wid, delta_model(model), dv, shard):
                released.append(dv)
        return [unknown, released]
