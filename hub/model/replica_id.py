"""`ReplicaId`: which copy of which shard of which version, on which worker. The one place it is encoded.

A replica is one worker's full (or, while fetching, partial) copy of one shard of one committed
version. `slot` is `live` (the worker's own buffers: a trainer's parameters or a reader's fetch
target) or `seed` (a host copy made by offload-seeding). On the wire (RPC replies, data-plane
tickets, the hub's tables, `HubClient.held()`) it is the string `worker:model:version:shard:slot`;
only `wire` and `parse` here know that format. Model names cannot contain ':' (wire_args refuses
them), nor can worker ids, shard keys or slots, so the string decodes unambiguously.

    >>> rid = ReplicaId("w3", "policy", 7, "tp0-pp0")
    >>> rid.wire
    'w3:policy:7:tp0-pp0:live'
    >>> ReplicaId.parse(rid.wire) == rid, rid.as_seed().slot
    (True, 'seed')
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from rlsync.hub.errors import ProtocolError

SLOTS = ("live", "seed")


@dataclass(frozen=True, slots=True)
class ReplicaId:
    worker: str
    """Hub worker id of the holder (e.g. 'w3', or 'w<epoch>.<n>' after a hub restart)."""
    model: str
    version: int
    shard: str
    """The shard's key, `Shard.key` (e.g. 'tp0-pp0')."""
    slot: str = "live"
    """'live' (the worker's own buffers) or 'seed' (a host copy kept to retain a version)."""

    @property
    def wire(self) -> str:
        return f"{self.worker}:{self.model}:{self.version}:{self.shard}:{self.slot}"

    def __str__(self) -> str:
        return self.wire

    def as_seed(self) -> ReplicaId:
        """The id of this replica's offload-seed copy (same worker, model, version, shard)."""
        return replace(self, slot="seed")

    def as_live(self) -> ReplicaId:
        return replace(self, slot="live")

    @classmethod
    def parse(cls, wire: str) -> ReplicaId:
        """Decode the wire string; a malformed one is a ProtocolError (it came from a peer or the hub)."""
        parts = wire.split(":") if isinstance(wire, str) else []
        if len(parts) != 5 or not all(parts) or not parts[2].isdigit() or parts[4] not in SLOTS:
            raise ProtocolError(f"malformed replica id {wire!r}: want worker:model:version:shard:{'|'.join(SLOTS)}")
        worker, model, version, shard, slot = parts
        return cls(worker, model, int(version), shard, slot)
