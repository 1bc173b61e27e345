"""HubState's delta protocol: for a reader holding v_base, full fetch of v or a chain of deltas? No I/O.

A mixin of `HubState` (hub/state/__init__.py). Deltas are versions of the companion model `NAME@delta`
(hub/delta/plan.py), so who holds which delta is the ordinary replica table; this only walks the
chain back from v to the reader's base and asks `delta_plan.choose`.
"""
from __future__ import annotations

from rlsync.hub.delta.plan import choose, delta_base

from rlsync.hub.model.names import delta_model
from rlsync.hub.model.shard import Shard


class Deltas:
    """`choose_update`: resolve the version and say how this reader should get it."""

    def choose_update(self, wid: str, model: str, version, shard: Shard, base: int,
                      into_spec: list | None = None) -> dict:
        reader = self.touch(wid)
        m = self.model(model)
        ver = self.resolve_version(m, model, version)
        manifest = self.shard_manifest(m, model, ver, shard, into_spec)
        # "manifest": the object; the server sends its digest (the reader holds the layout and takes the
        # checksums from the delta's frames) or, for a full fetch, nothing (the plan carries it)
        out = {"version": ver, "manifest": manifest, "chain": [], "full_bytes": manifest.nbytes,
               "delta_bytes": 0, "est_full_s": 0.0, "est_delta_s": 0.0}
        if base == ver:
            return out | {"mode": "held"}
        chain = self._delta_chain(wid, reader, model, ver, shard.key, base)
        full = self._candidates(wid, model, ver, shard.key)
        full_tier = min((reader.location.distance(self.workers[r.worker].location) for r in full), default=None)
        mode, t_full, t_delta = choose(self.policy(model).delta, full_bytes=manifest.nbytes, full_tier=full_tier,
                                       chain=[(b, t) for _, b, t in chain], model_bytes=manifest.nbytes)
        if mode == "full" and full_tier is None and chain:
            mode = "delta"  # nobody serves v in full right now, but its deltas are there
        return out | {"mode": mode, "chain": [v for v, _, _ in chain], "delta_bytes": sum(b for _, b, _ in chain),
                      "est_full_s": t_full if t_full != float("inf") else -1.0,
                      "est_delta_s": t_delta if t_delta != float("inf") else -1.0}

    def _delta_chain(self, wid: str, reader, model: str, ver: int, shard_key: str,
                     base: int) -> list[tuple[int, int, int]]:
        """[(delta version, its bytes, best source tier)] from base+ to ver, oldest first; [] if broken."""
        dm = self.models.get(delta_model(model))
        if dm is None or base >= ver:
            return []
        chain, cur = [], ver
        while cur > base and len(chain) <= self.policy(model).delta.max_chain:
            dvr = dm.versions.get(cur)
            man = dvr.manifests.get(shard_key) if dvr is not None and dvr.committed else None
            if man is None:
                return []
            holders = self._candidates(wid, dm.name, cur, shard_key)
            if not holders:
                return []
            tier = min(reader.location.distance(self.workers[r.worker].location) for r in holders)
            chain.append((cur, man.nbytes, tier))
            cur = delta_base(man)
        return chain[::-1] if cur == base else []
