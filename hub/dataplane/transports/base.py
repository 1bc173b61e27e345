"""The data-plane `Transport` interface and its registry.

A transport moves the bytes of transfer units from a source's `LocalReplica` into a reader's.
Both sides share the request framing in `rlsync.hub.dataplane.transfer` (ticket check, relay waits, drain
accounting); a transport only says how a unit's bytes travel once the server decided to send it.
Adding a transport is one new file with `@register_transport("name")`.
"""
from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from typing import Callable, ClassVar

from rlsync.hub.errors import TransportUnavailableError
from rlsync.hub.dataplane.store import LocalReplica
from rlsync.hub.protocol.messages import Endpoint

_REGISTRY: dict[str, type["Transport"]] = {}


def register_transport(name: str):
    def deco(cls: type[Transport]) -> type[Transport]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def registered() -> dict[str, type["Transport"]]:
    """Every registered transport class by name, sorted by name (available here or not)."""
    return dict(sorted(_REGISTRY.items()))


def transport_names() -> list[str]:
    return sorted(_REGISTRY)


def get_transport(name: str) -> "Transport":
    if name not in _REGISTRY:
        raise TransportUnavailableError(f"unknown transport {name!r}; known: {transport_names()}")
    cls = _REGISTRY[name]
    cls.check_available()
    return cls()


def transport_by_kind(kind: int) -> type["Transport"] | None:
    return next((c for c in _REGISTRY.values() if c.kind == kind), None)


class Transport(ABC):
    name: ClassVar[str]
    kind: ClassVar[int]
    """The byte that names this transport in a data-plane request header."""
    priority: ClassVar[int] = 0
    """Among usable transports the reader picks the highest priority."""
    max_streams: ClassVar[int] = 1
    """Parallel connections per source a reader may open (`DataPlaneConfig.streams` is capped by it)."""
    zero_copy: bool = True
    """Reader side: the send mode it asks the source for (only `tcp` has a copying alternative);
    set per reader from the data-path calibration (rlsync.hub.dataplane.tuning) or the config."""

    @classmethod
    def check_available(cls) -> None:
        """Raise TransportUnavailableError saying what is missing, if this cannot run here."""

    @classmethod
    def is_available(cls) -> bool:
        try:
            cls.check_available()
            return True
        except TransportUnavailableError:
            return False

    @classmethod
    def endpoint_info(cls) -> dict:
        """What a worker where this transport is available advertises about it when it joins, under
        the transport's own key (e.g. rdma's link layer), for `usable_between` on its peers."""
        return {}

    def usable_between(self, mine: Endpoint, peer: Endpoint) -> bool:
        """Can a reader with endpoint `mine` read from a server with endpoint `peer` this way?"""
        return self.name in peer.transports

    @abstractmethod
    def send_unit(self, conn: socket.socket, rep: LocalReplica, u: int) -> int:
        """Server side: deliver unit u of `rep` (present) on `conn`. Returns bytes moved."""

    @abstractmethod
    def recv_unit(self, conn: socket.socket, dest: LocalReplica, u: int, nbytes: int, peer: Endpoint) -> int | None:
        """Reader side: the server announced unit u with `nbytes` of payload; land it in `dest`.

        May return the unit's xxh3-64 if it hashed the bytes on the way in (None: the caller hashes).
        """

    def open_request(self, dest: LocalReplica, peer: Endpoint) -> dict | None:
        """Reader side, before the request goes out: set up per-connection state (e.g. an RDMA queue
        pair) and return what the server must know of it; it travels in the request body as "x"."""
        return None

    def accept_request(self, extra, rep: LocalReplica) -> None:
        """Server side, after the ticket check: take the reader's `open_request` answer (None if it
        sent none). Raise a HubError (ProtocolError, TransferError) to refuse the request."""

    def close(self) -> None:
        """Either side, once per connection, however it ended: release per-connection resources."""

    def finish(self, conn: socket.socket) -> None:
        """Reader side, after the last unit (e.g. tell the server its memory is no longer read)."""

    def wait_finish(self, conn: socket.socket) -> None:
        """Server side, after the last unit: wait until the reader no longer needs the source memory."""


def boot_id() -> str:
    """This machine's boot: same-host transports (shm, cuda_ipc) and the path choice compare it."""
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        return ""


def recv_exact(conn: socket.socket, view: memoryview) -> None:
    """Fill `view` from `conn`; raise ConnectionError if the peer closes early."""
    pos, n = 0, len(view)
    while pos < n:
        got = conn.recv_into(view[pos:], n - pos)
        if got == 0:
            raise ConnectionError("peer closed the connection mid-unit")
        pos += got


UnitCallback = Callable[[int], None]
