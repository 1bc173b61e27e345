"""The control messages a reader acts on, typed once where they arrive: a fetch plan and its sources.

The hub builds them as maps (hub/server/plan_replies.py for fetch and re-plan replies, server/loop.py
`_plan_fields` for the first plan of a delta chain); `from_wire` checks a reply's shape and types it,
so no client code reads a plan by string key and a malformed reply is a ProtocolError, not a KeyError.

    plan = FetchPlan.from_wire(reply)          # plan.fetch_id, plan.version, plan.held, plan.sources
    plan.sources[0].units                      # the units this source serves
"""
from __future__ import annotations

from dataclasses import dataclass

from rlsync.hub.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Source:
    """One source of a plan: which replica (of which worker, at which endpoint) serves which units, and
    the ticket the reader presents to it."""

    replica: str
    worker: str
    endpoint: dict
    """The worker's data-plane endpoint as it joined ({"tcp": "host:port", ...}: the transports read it)."""
    units: tuple[int, ...]
    full: bool
    ticket: bytes

    @classmethod
    def from_wire(cls, d) -> "Source":
        try:
            return cls(str(d["replica"]), str(d["worker"]), dict(d["endpoint"]), tuple(int(u) for u in d["units"]),
                       bool(d.get("full", True)), d["ticket"])
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"malformed plan source ({type(e).__name__}: {e})") from None

    @classmethod
    def list_from_wire(cls, reply) -> "list[Source]":
        """The sources of a fetch plan or a re-plan reply ({"sources": [...]})."""
        if not isinstance(reply, dict) or not isinstance(reply.get("sources"), list):
            raise ProtocolError("malformed plan: no source list")
        return [cls.from_wire(s) for s in reply["sources"]]


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """The hub's answer to a fetch: which version, whether this reader holds it already, the sources,
    and the version's manifest (`manifest`, its wire form) or only its digest when the reader said it
    has it (hub/client/manifests.py)."""

    fetch_id: str
    version: int
    held: bool
    sources: tuple[Source, ...]
    manifest: dict | None = None
    manifest_digest: str | None = None

    @classmethod
    def from_wire(cls, d) -> "FetchPlan":
        if not isinstance(d, dict):
            raise ProtocolError("malformed plan: not a map")
        try:
            held = bool(d.get("held"))
            sources = tuple(Source.list_from_wire(d)) if not held or d.get("sources") else ()
            digest = d.get("manifest_digest")
            return cls(str(d.get("fetch_id", "")), int(d["version"]), held, sources, d.get("manifest"),
                       digest if isinstance(digest, str) else None)
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"malformed plan ({type(e).__name__}: {e})") from None
