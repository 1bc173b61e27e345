"""The control messages a reader acts on, typed once where they arrive: a fetch plan, its sources, and
a worker's data-plane endpoint.

The hub builds them as maps (hub/server/plan_replies.py for fetch and re-plan replies, server/loop.py
`_plan_fields` for the first plan of a delta chain); `from_wire` checks a reply's shape and types it,
so no client code reads a plan by string key and a malformed reply is a ProtocolError, not a KeyError.

    plan = FetchPlan.from_wire(reply)          # plan.fetch_id, plan.version, plan.held, plan.sources
    plan.sources[0].units                      # the units this source serves
    plan.sources[0].endpoint.tcp               # where its data-plane server listens (an `Endpoint`)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from rlsync.hub.errors import ProtocolError

_CORE = ("tcp", "pid", "host", "boot_id", "transports", "reader_key")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A worker's data-plane endpoint, as it joins with it and as readers get it in plans.

        Endpoint(tcp="10.0.0.7:41234", pid=812, host="node3", boot_id="...", transports=("tcp", "shm"))

    The transports read only this (`Transport.usable_between(mine, peer)`, `recv_unit(..., peer)`); what
    a transport adds about itself when it is available (rdma's link layer, cuda's devices) rides under its
    own key in `extra` (`info("rdma")`). `reader_key` is the worker's own session key: sent when it joins,
    never passed on to the workers that read from it."""

    tcp: str
    """"host:port" of its data-plane server."""
    pid: int = 0
    host: str = ""
    boot_id: str = ""
    """This machine's boot id: same-host transports (shm, cuda_ipc) need it equal and non-empty."""
    transports: tuple[str, ...] = ()
    """The transports it serves."""
    reader_key: bytes | None = None
    extra: Mapping = field(default_factory=lambda: MappingProxyType({}))
    """Transport name -> what that transport advertises (see `Transport.endpoint_info`)."""

    def info(self, key: str) -> dict:
        """What the transport `key` advertised here ({} when nothing)."""
        v = self.extra.get(key)
        return v if isinstance(v, dict) else {}

    def same_host(self, other: "Endpoint") -> bool:
        """Same machine, same boot: where shared memory and process reads can work."""
        return self.boot_id == other.boot_id != "" and self.host == other.host

    def to_wire(self) -> dict:
        d = {"tcp": self.tcp, "pid": self.pid, "host": self.host, "boot_id": self.boot_id,
             "transports": list(self.transports), **self.extra}
        if self.reader_key is not None:
            d["reader_key"] = self.reader_key
        return d

    @classmethod
    def from_wire(cls, d) -> "Endpoint":
        """Typed from a map; a malformed one is a ProtocolError naming what is wrong."""
        if not isinstance(d, dict):
            raise ProtocolError("malformed endpoint: not a map")
        tcp, pid, host, boot, names, key = (d.get(k) for k in _CORE)
        if not isinstance(tcp, str) or ":" not in tcp:
            raise ProtocolError("malformed endpoint: 'tcp' must be 'host:port'")
        if not isinstance(pid or 0, int) or not isinstance(host or "", str) or not isinstance(boot or "", str):
            raise ProtocolError("malformed endpoint: 'pid' must be an int, 'host' and 'boot_id' strings")
        if not isinstance(names or [], (list, tuple)) or not all(isinstance(n, str) for n in names or []):
            raise ProtocolError("malformed endpoint: 'transports' must be a list of names")
        if key is not None and not isinstance(key, bytes):
            raise ProtocolError("malformed endpoint: 'reader_key' must be bytes")
        extra = MappingProxyType({k: v for k, v in d.items() if k not in _CORE})
        return cls(tcp, pid or 0, host or "", boot or "", tuple(names or ()), key, extra)


@dataclass(frozen=True, slots=True)
class Source:
    """One source of a plan: which replica (of which worker, at which endpoint) serves which units, and
    the ticket the reader presents to it."""

    replica: str
    worker: str
    endpoint: Endpoint
    """The worker's data-plane endpoint as it joined (without its reader key)."""
    units: tuple[int, ...]
    full: bool
    ticket: bytes

    @classmethod
    def from_wire(cls, d) -> "Source":
        try:
            return cls(str(d["replica"]), str(d["worker"]), Endpoint.from_wire(d["endpoint"]), tuple(int(u) for u in d["units"]),
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
