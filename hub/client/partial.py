"""A partial fetch: only some transfer units of a shard, each verified against its own checksum.

    res = hub.fetch_units("policy", "latest", Shard(tp=0, tp_size=2), into, want)   # HubClient delegates here

`want(manifest)` names the units the reader needs (e.g. those overlapping its TP slice's byte ranges:
hub/reshard/read.py); only those move, from the sources the hub plans, verified unit by unit as in a
whole fetch. A unit is the smallest range that can be verified (its xxh3 is in the publisher's
manifest), so a publisher that wants slice readers to move little cuts its shard into small units
(`publish(..., manifest_config=...)`).

The reader is not a relay: it holds only part of the shard, so it asks with `relay=false` and the hub never
advertises it as one (no other reader is planned on it); it ends the fetch with `fetch_done(ok=False)` and
registers nothing. A shard this worker already holds in full is copied from it (no transfer).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from rlsync.hub import errors as E
from rlsync.hub.model.manifest import Manifest, dtype_name
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.shard import Shard
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.args import check_coords
from rlsync.hub.protocol.messages import FetchPlan, Source

if TYPE_CHECKING:
    from rlsync.hub.client.fetch import Fetcher


@dataclass(slots=True)
class PartialResult:
    version: int
    units: list[int]
    """The units fetched (each verified); the rest of `into` is untouched."""
    bytes_by_source: dict[str, int]
    manifest: Manifest


def fetch_units(f: "Fetcher", model: str, version: int | str, shard: Shard, into: dict[str, torch.Tensor],
                want: Callable[[Manifest], list[int]]) -> PartialResult:
    """Fetch the units `want(manifest)` of (model, version, shard) into `into` (shaped like the shard), with
    the client's fetch part `f` (its session, replica book and manifests)."""
    wid = f.session.need_join()
    check_coords("fetch", model, version, shard)
    spec = [[n, dtype_name(t.dtype), list(t.shape)] for n, t in into.items()]
    have = f.manifests.have(model, shard)
    plan = FetchPlan.from_wire(f.session.call("fetch", wid=wid, model=model, version=version, shard=shard.to_wire(),
                                         group=None, into_spec=spec, have_manifests=list(have), relay=False))
    if plan.held:  # held here in full: copy what is asked from it
        res = f.fetch(model, plan.version, into=into, shard=shard)
        return PartialResult(res.version, list(range(len(res.manifest.units))), {}, res.manifest)
    fid, ver = plan.fetch_id, plan.version
    try:
        manifest = f.manifests.take(plan, have, model, shard)
        manifest.check_buffers(into)
        units = sorted(set(want(manifest)))
        if any(not isinstance(u, int) or not 0 <= u < len(manifest.units) for u in units):
            raise E.ProtocolError(f"want named units outside [0, {len(manifest.units)})")
        rid = ReplicaId(wid, model, ver, shard.key).wire + "#partial"
        # Units not wanted count as present, so the pull and its re-plans ask only for the wanted ones.
        dest = LocalReplica(rid, manifest, dict(into), full=False)
        wanted = set(units)
        dest.present = [u not in wanted for u in range(len(manifest.units))]
        per_source: dict[str, int] = {}
        sources, attempts = plan.sources, 0
        while True:
            failed, errors = f.pull_all(sources, dest, per_source, {})
            missing = [u for u in units if not dest.present[u]]
            if not missing:
                break
            attempts += 1
            if attempts > f.cfg.replan_attempts or not failed or \
                    any(not isinstance(e, (E.TransferError, E.TicketError, E.ProtocolError)) for e in errors):
                raise errors[0] if errors else E.ProtocolError("fetch plan did not cover every wanted unit")
            sources = Source.list_from_wire(f.session.call("replan", wid=wid, fetch_id=fid, failed=failed, units=missing))
    finally:
        f.fetch_done(fid, ok=False)  # a partial read: never a replica
    return PartialResult(ver, units, per_source, manifest)
