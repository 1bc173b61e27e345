"""Data-plane tickets: the hub signs, each worker's data-plane server verifies, offline.

A ticket names one fetch, its reader (worker id and the public half of the reader's session key),
the source worker and replica it may read, and an expiry a few seconds away. The hub signs it with an
Ed25519 key that only the hub holds (a 0600 key file beside the journal, never in the journal);
data-plane servers verify with the public key they got at `join`. A worker that knows the RPC token
still cannot forge a ticket for a read the hub did not plan.

A ticket alone does not open a read: each data-plane request also carries a fresh random nonce and a
proof — the request body signed with the reader's session key (`ReaderKey`, generated per client and
never sent anywhere). The server checks the proof against the key named in the ticket and refuses a
nonce it has already seen while that ticket lives. So a captured ticket or a captured request is
useless to anyone else: another process has no session key, and a replayed request repeats a nonce.

    reader = ReaderKey()                                      # the reader, once per HubClient
    blob = signer.sign(Ticket("f1", "w1", reader.public_bytes, "w2", "w2:policy:3:tp0-pp0:live",
                              time.time() + 10))              # the hub, per planned source
    body = reader.sign_request(blob, "w2:...", [0, 1])       # the reader, per connection
    # the source (DataServer): verifier.verify(ticket) then ReplayGuard.check(ticket, req, proof, nonce)
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import TicketError

_SIG = 64
_KEY = 32
NONCE_BYTES = 16
MAX_REPLAY_ENTRIES = 1 << 20
"""A data-plane server remembers at most this many live nonces (refusing reads beyond it)."""


def _raw_private(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True, slots=True)
class Ticket:
    fetch_id: str
    reader: str
    reader_key: bytes
    """Public half of the reader's session key: only the holder of the private half can use it."""
    source: str
    replica: str
    expires: float


class TicketSigner:
    def __init__(self, private_bytes: bytes | None = None) -> None:
        self._key = (Ed25519PrivateKey.from_private_bytes(private_bytes) if private_bytes
                     else Ed25519PrivateKey.generate())

    @classmethod
    def from_key_file(cls, path: str) -> "TicketSigner":
        """The hub's signing key from `path`, created there (mode 0600, O_EXCL: never readable by
        others, not even for an instant) if absent."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return cls(read_key_file(path))
        signer = cls()
        with os.fdopen(fd, "wb") as f:
            f.write(signer.private_bytes)
            f.flush()
            os.fsync(f.fileno())
        return signer

    @property
    def private_bytes(self) -> bytes:
        return _raw_private(self._key)

    @property
    def public_bytes(self) -> bytes:
        return _raw_public(self._key)

    def sign(self, t: Ticket) -> bytes:
        body = msgpack.packb([t.fetch_id, t.reader, t.reader_key, t.source, t.replica, t.expires])
        return self._key.sign(body) + body


def read_key_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)  # tighten a key file someone loosened
        key = os.read(fd, 4 * _KEY)
    finally:
        os.close(fd)
    if len(key) != _KEY:
        raise TicketError(f"ticket key file {path} is corrupt ({len(key)} bytes, want {_KEY})")
    return key


class ReaderKey:
    """A reader's session key: proves to a data-plane server that it is the reader a ticket names."""

    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        self.public_bytes = _raw_public(self._key)

    def sign_request(self, ticket: bytes, replica: str, units: list[int], extra=None) -> bytes:
        """A data-plane request body: {"req": packed {ticket, replica, units, x, nonce}, "proof":
        Ed25519 signature of those packed bytes with this session key}."""
        req = {"ticket": ticket, "replica": replica, "units": units, "nonce": os.urandom(NONCE_BYTES)}
        if extra is not None:
            req["x"] = extra
        body = msgpack.packb(req)
        return msgpack.packb({"req": body, "proof": self._key.sign(body)})


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
            if not isinstance(t.reader_key, bytes) or len(t.reader_key) != _KEY:
                raise ValueError
            float(t.expires)
        except InvalidSignature:
            raise TicketError("forged ticket: signature does not verify") from None
        except Exception:
            raise TicketError("malformed ticket") from None
        if t.source != source or t.replica != replica:
            raise TicketError(f"ticket is for {t.replica} at {t.source}, not {replica} here")
        if t.expires < time.time():
            raise TicketError("expired ticket")
        return t


class ReplayGuard:
    """Per data-plane server: a request must be signed by the ticket's reader, and used once."""

    def __init__(self) -> None:
        self._seen: dict[bytes, float] = {}  # nonce -> expiry of the ticket it came with
        self._lock = threading.Lock()
        self._next_prune = 0.0

    def check(self, t: Ticket, body: bytes, proof: object, nonce: object) -> None:
        if not isinstance(proof, bytes) or len(proof) != _SIG:
            raise TicketError("request carries no proof of the reader's session key")
        try:
            Ed25519PublicKey.from_public_bytes(t.reader_key).verify(proof, body)
        except (InvalidSignature, ValueError):
            raise TicketError(f"request not signed by the reader the ticket names ({t.reader}): "
                              "someone else's ticket") from None
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise TicketError("request without a valid nonce")
        now = time.time()
        with self._lock:
            if nonce in self._seen:
                raise TicketError("replayed request: this nonce was already used")
            if now >= self._next_prune or len(self._seen) >= MAX_REPLAY_ENTRIES:
                for k in [k for k, exp in self._seen.items() if exp < now]:  # expired: refused anyway
                    del self._seen[k]
                self._next_prune = now + 1.0
                if len(self._seen) >= MAX_REPLAY_ENTRIES:
                    raise TicketError("too many live tickets at this data-plane server; retry")
            self._seen[nonce] = t.expires

    def __len__(self) -> int:
        return len(self._seen)
