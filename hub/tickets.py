"""Data-plane tickets: the hub signs, each worker's data-plane server verifies, offline.

A ticket names one fetch, its reader, the source worker and replica it may read, and an expiry.
The hub signs it with an Ed25519 key that only the hub holds; data-plane servers verify with the
public key they got at `join`. A worker that knows the RPC token still cannot forge a ticket for a
read the hub did not plan.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import TicketError

_SIG = 64


@dataclass(frozen=True, slots=True)
class Ticket:
    fetch_id: str
    reader: str
    source: str
    replica: str
    expires: float


class TicketSigner:
    def __init__(self, private_bytes: bytes | None = None) -> None:
        self._key = (Ed25519PrivateKey.from_private_bytes(private_bytes) if private_bytes
                     else Ed25519PrivateKey.generate())

    @property
    def private_bytes(self) -> bytes:
        return self._key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                       serialization.NoEncryption())

    @property
    def public_bytes(self) -> bytes:
        return self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign(self, t: Ticket) -> bytes:
        body = msgpack.packb([t.fetch_id, t.reader, t.source, t.replica, t.expires])
        return self._key.sign(body) + body


class TicketVerifier:
    def __init__(self, public_bytes: bytes) -> None:
        self._key = Ed25519PublicKey.from_public_bytes(public_bytes)

    def verify(self, blob: object, *, source: str, replica: str) -> Ticket:
        if not isinstance(blob, bytes) or len(blob) <= _SIG:
            raise TicketError("missing or malformed ticket")
        sig, body = blob[:_SIG], blob[_SIG:]
        try:
            self._key.verify(sig, body)
            t = Ticket(*msgpack.unpackb(body))
        except InvalidSignature:
            raise TicketError("forged ticket: signature does not verify") from None
        except Exception:
            raise TicketError("malformed ticket") from None
        if t.source != source or t.replica != replica:
            raise TicketError(f"ticket is for {t.replica} at {t.source}, not {replica} here")
        if t.expires < time.time():
            raise TicketError("expired ticket")
        return t
