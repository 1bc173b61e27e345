"""Manifests the hub already holds, recognized in a request's raw bytes so they are not decoded again.

After a hub restart every worker re-registers what it holds, each `register` carrying the version's
whole manifest (61 KB for 1,000 units). Decoding that map costs ~0.6-0.9 ms of CPU, most of a
re-registration; at 10k workers the storm is bound by it. A manifest's msgpack encoding is the same
wherever it sits in a message, so the hub looks for the encodings of the manifests it knows (committed
versions, newest first) in `register` / `publish` requests, decodes the rest with a private marker in
that place, and hands the handler the `Manifest` it already has.

Exactness: the marker embeds a random token (no client can send it), the request must not contain it
already, and the decoded request must hold it exactly as the value of `args.manifest`; otherwise the
request is decoded as a whole, as always. So a hit decodes to what a full decode would (an equal map,
whose parse is the same immutable `Manifest`).
"""
from __future__ import annotations

import secrets
from collections import OrderedDict

import msgpack

from rlsync.hub.errors import ProtocolError
from rlsync.hub.model.manifest import Manifest
from rlsync.hub.protocol.rpc import pack, unpack

WITH_MANIFEST = ("register", "publish")
MIN_BYTES = 4096
"""Smaller manifests decode fast enough: not worth a search."""


class KnownManifests:
    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._by: OrderedDict[bytes, Manifest] = OrderedDict()
        self._mark = "rlsync-known-manifest-" + secrets.token_hex(16)
        self._mark_bytes = pack(self._mark)
        self.hits = 0

    def add(self, m: Manifest) -> None:
        b = pack(m.to_wire())
        if len(b) < MIN_BYTES:
            return
        self._by[b] = m
        self._by.move_to_end(b)
        while len(self._by) > self.size:
            self._by.popitem(last=False)

    def decode(self, data: bytes):
        """`unpack(data)`, with a known manifest in `args.manifest` given as its `Manifest` object."""
        if len(data) < MIN_BYTES or not self._by or _op(data) not in WITH_MANIFEST or self._mark_bytes in data:
            return unpack(data)
        for b, m in reversed(self._by.items()):
            i = data.find(b)
            if i < 0:
                continue
            try:
                msg = unpack(data[:i] + self._mark_bytes + data[i + len(b):])
            except ProtocolError:  # the bytes sat inside another value: not this manifest
                break
            args = msg.get("args") if isinstance(msg, dict) else None
            if isinstance(args, dict) and args.get("manifest") == self._mark:
                args["manifest"] = m
                self._by.move_to_end(b)
                self.hits += 1
                return msg
            break
        return unpack(data)


def _op(data: bytes):
    """The request's `op` if it comes first or second in its map (as `RpcChannel` sends it), else None."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(data[:512])
    try:
        for _ in range(min(2, u.read_map_header())):
            k, v = u.unpack(), u.unpack()
            if k == "op":
                return v
    except Exception:  # noqa: BLE001 - not a map or cut short: the full decode says what is wrong
        return None
    return None
