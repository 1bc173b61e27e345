"""Data-plane tickets: the hub signs, each worker's data-plane server verifies, offline.

A ticket names one fetch, its reader (worker id and the public half of the reader's session key),
the source worker and replica it may read, and an expiry a few seconds away. The hub signs it with an
Ed25519 key that only the hub holds (a 0600 key file beside the journal, never in the journal);
data-plane servers verify with the public key they got at `join`. A worker that knows the RPC token
still cannot forge a ticket for a read the hub did not plan.

The hub signs the tickets of many plans at once (`sign_many`: one Ed25519 signature, ~60-180 us, was
the largest cost of a plan): the tickets are the leaves of a Merkle tree (SHA-256, leaves and inner
nodes hashed with distinct prefixes), the signature covers its root, and each ticket carries its
leaf's index, the leaf count (signed with the root) and the sibling hashes up to the root. A verifier recomputes the root
from the ticket's own body, so a ticket still proves exactly the one read it names: changing a byte
of the body, the index or a sibling yields another root, which the signature does not cover.

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

import hashlib
import os
import struct
import threading
import time
from dataclasses import dataclass

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from rlsync.hub.errors import TicketError

_SIG = 64
_KEY = 32
_HASH = 32
_HEAD = struct.Struct("<II")  # leaf index, leaf count
MAX_BATCH = 1 << 12
"""Most tickets under one signature (a ticket then carries at most 12 sibling hashes)."""
_ROOT_TAG = b"rlsync ticket batch root v1\x00"
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
    share: tuple[str, float] | None = None
    """The reader's tenant and its data-plane weight (hub/dataplane/shares.py); None: not scheduled."""


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
        return self.sign_many([t])[0]

    def sign_many(self, tickets: list[Ticket]) -> list[bytes]:
        """Every ticket under one signature (module docstring), in order; batches above MAX_BATCH split."""
        out: list[bytes] = []
        for i in range(0, len(tickets), MAX_BATCH):
            out.extend(self._sign_batch(tickets[i:i + MAX_BATCH]))
        return out

    def _sign_batch(self, tickets: list[Ticket]) -> list[bytes]:
        bodies = [msgpack.packb([t.fetch_id, t.reader, t.reader_key, t.source, t.replica, t.expires]
                                + ([] if t.share is None else [list(t.share)])) for t in tickets]
        levels = [[_leaf(b) for b in bodies]]
        while len(levels[-1]) > 1:
            lv = levels[-1]
            levels.append([_node(lv[k], lv[k + 1]) if k + 1 < len(lv) else lv[k] for k in range(0, len(lv), 2)])
        n, out = len(bodies), []
        sig = self._key.sign(_ROOT_TAG + n.to_bytes(4, "little") + levels[-1][0])
        for i, body in enumerate(bodies):
            path, idx = [], i
            for lv in levels[:-1]:
                if idx ^ 1 < len(lv):
                    path.append(lv[idx ^ 1])
                idx >>= 1
            out.append(b"".join([sig, _HEAD.pack(i, n), *path, body]))
        return out


def _leaf(body: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + body).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _root(blob: bytes) -> tuple[bytes, bytes, bytes]:
    """(signature, signed message, body) of a ticket blob: the root recomputed from its body and path,
    with the leaf count (signed too: no byte of a ticket can change without the signature failing)."""
    sig, (idx, n), at = blob[:_SIG], _HEAD.unpack_from(blob, _SIG), _SIG + _HEAD.size
    if not 0 <= idx < n <= MAX_BATCH:
        raise ValueError("ticket index out of its batch")
    siblings, width, i = [], n, idx
    while width > 1:  # which levels have a sibling follows from (index, count)
        siblings.append(i ^ 1 < width)
        width, i = (width + 1) // 2, i >> 1
    body = blob[at + _HASH * sum(siblings):]
    if not body:
        raise ValueError("ticket without a body")
    h, i = _leaf(body), idx
    for has in siblings:
        if has:
            sib = blob[at:at + _HASH]
            at += _HASH
            h = _node(h, sib) if i % 2 == 0 else _node(sib, h)
        i >>= 1
    return sig, _ROOT_TAG + n.to_bytes(4, "little") + h, body


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
        if not isinstance(blob, bytes) or len(blob) <= _SIG + _HEAD.size:
            raise TicketError("missing or malformed ticket")
        try:
            sig, root, body = _root(blob)
        except (ValueError, struct.error):
            raise TicketError("malformed ticket") from None
        try:
            self._key.verify(sig, root)
            t = Ticket(*msgpack.unpackb(body))
            if not isinstance(t.reader_key, bytes) or len(t.reader_key) != _KEY:
                raise ValueError
            float(t.expires)
            if t.share is not None:
                name, weight = t.share
                if not isinstance(name, str) or not 0 < float(weight) < float("inf"):
                    raise ValueError
                t = Ticket(*msgpack.unpackb(body)[:6], (name, float(weight)))
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
