"""Plan replies, signed in batches: the server collects the plans it answers in one pass of its
event loop and signs all their tickets with one signature (`TicketSigner.sign_many`), then sends
them. One Ed25519 signature per source was the largest cost of a plan (issue 19); a batch shares it.

A plan is answered at the end of the pass that planned it (at most 256 requests, usually a few), so a
reader waits no longer than the hub takes to read the requests it already has. No I/O of its own:
`flush` hands each reply to the server's `send`.
"""
from __future__ import annotations

import time
from typing import Callable

from rlsync.hub.server.load import HubLoad, ManifestBytes, packed_map
from rlsync.hub.state.records import Plan
from rlsync.hub.protocol.tickets import Ticket, TicketSigner


class Packed(bytes):
    """An operation's result already encoded as msgpack (the server's `_reply` embeds it as is)."""


class PlanReplies:
    def __init__(self, signer: TicketSigner, load: HubLoad, ticket_ttl_s: float,
                 share_of: Callable[[str], tuple[str, float] | None] = lambda wid: None) -> None:
        self.signer, self.load, self.ttl = signer, load, ticket_ttl_s
        self.share_of = share_of
        """The reader's tenant and data-plane weight its tickets carry (hub/server/tenancy.py)."""
        self.manifests = ManifestBytes()
        self._queue: list[tuple[bytes, object, dict, list[Ticket], bytes | None, float]] = []

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, ident: bytes, rid, wid: str, reader_key: bytes, plan: Plan, t0: float,
            have: frozenset | None = None, with_manifest: bool = True) -> None:
        """Queue the reply to a plan: its manifest's digest when the reader named the manifests it has
        (`have`), and the manifest itself unless it is one of them (a reader without `have` always gets
        it); one ticket per source, signed at `flush`."""
        exp = time.time() + self.ttl
        packed, digest = self.manifests.entry(plan.manifest)
        head = {"fetch_id": plan.fetch_id, "version": plan.version, "held": plan.held,
                "sources": [{"replica": rep.id, "worker": w.id, "endpoint": w.peer_endpoint,
                             "units": units, "full": rep.full}
                            for rep, w, units in plan.sources],
                **({} if have is None else {"manifest_digest": digest})}
        share = self.share_of(wid)
        tickets = [Ticket(plan.fetch_id, wid, reader_key, w.id, rep.id, exp, share) for rep, w, _ in plan.sources]
        raw = packed if with_manifest and (have is None or digest not in have) else None
        self._queue.append((ident, rid, head, tickets, raw, time.perf_counter() - t0))

    def fields(self, wid: str, reader_key: bytes, plan: Plan) -> dict:
        """A plan as a map, its tickets signed now, one signature each (delta_choose's first plan)."""
        exp, share = time.time() + self.ttl, self.share_of(wid)
        return {"fetch_id": plan.fetch_id, "version": plan.version, "held": plan.held,
                "sources": [{"replica": rep.id, "worker": w.id, "endpoint": w.peer_endpoint,
                             "units": units, "full": rep.full,
                             "ticket": self.signer.sign(Ticket(plan.fetch_id, wid, reader_key, w.id, rep.id, exp,
                                                               share))}
                            for rep, w, units in plan.sources]}

    def flush(self, send: Callable[[bytes, object, bool, Packed], None]) -> None:
        """Sign every queued plan's tickets at once and send the replies, in the order planned."""
        if not self._queue:
            return
        queue, self._queue = self._queue, []
        t0 = time.perf_counter()
        blobs = iter(self.signer.sign_many([t for *_, tickets, _, _ in queue for t in tickets]))
        share = (time.perf_counter() - t0) / len(queue)
        for ident, rid, head, tickets, raw, own_s in queue:
            t1 = time.perf_counter()
            for src in head["sources"]:
                src["ticket"] = next(blobs)
            send(ident, rid, True, Packed(packed_map(head, {} if raw is None else {"manifest": raw})))
            self.load.plan_done(own_s + share + time.perf_counter() - t1)
