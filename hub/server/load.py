"""The hub's own latency, as `stats` reports it: plan time, RPC rate, heartbeat lag. No I/O.

    plan_ms           p50 / p99 of the last `window` fetch and re-plan answers (state + planner +
                      tickets + encoding), milliseconds
    rpc_per_s         control RPCs answered per second over the last ~`rate_horizon_s` seconds
    heartbeat_lag_ms  p99 over live workers of the time since the hub last heard from each; with
                      heartbeats every H seconds it sits near H when the hub keeps up and grows toward
                      `worker_timeout_s` (expiry) when heartbeats queue behind other work

Also the encoded manifests the plans carry (`ManifestBytes`): a 1,000-unit manifest costs ~1 ms to
turn into a map and pack; a version's manifest is packed once and reused by every plan of it.
"""
from __future__ import annotations

import time
from collections import OrderedDict, deque

from rlsync.hub.model.manifest import Manifest, wire_digest
from rlsync.hub.protocol.rpc import pack


class HubLoad:
    def __init__(self, window: int = 2048, rate_horizon_s: float = 10.0) -> None:
        self._plans: deque[float] = deque(maxlen=window)
        self._counts: deque[tuple[float, int]] = deque()
        self.rate_horizon_s = rate_horizon_s

    def plan_done(self, seconds: float) -> None:
        self._plans.append(seconds * 1e3)

    def tick(self, rpc_count: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._counts.append((now, rpc_count))
        while len(self._counts) > 2 and now - self._counts[1][0] >= self.rate_horizon_s:
            self._counts.popleft()

    def snapshot(self, rpc_count: int, last_seen: list[float], now: float) -> dict:
        self.tick(rpc_count, now)
        (t0, c0), (t1, c1) = self._counts[0], self._counts[-1]
        plans = sorted(self._plans)
        silence = sorted(now - t for t in last_seen)
        return {"plan_ms": _pct(plans, 0.5), "plan_ms_p99": _pct(plans, 0.99), "plans_timed": len(plans),
                "rpc_per_s": (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0,
                "heartbeat_lag_ms": 1e3 * _pct(silence, 0.99)}


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else 0.0


class ManifestBytes:
    """Packed manifests and their digests by object (the entry holds the object, so its id is not
    reused while cached). The digest (blake2b-128 of the packed bytes, hex) names the manifest in a
    plan reply: a reader that already has it sends it back in `fetch`'s `have_manifests`."""

    def __init__(self, size: int = 16) -> None:
        self._cache: OrderedDict[int, tuple[Manifest, bytes, str]] = OrderedDict()
        self.size = size

    def get(self, m: Manifest) -> bytes:
        return self.entry(m)[0]

    def entry(self, m: Manifest) -> tuple[bytes, str]:
        hit = self._cache.get(id(m))
        if hit is not None and hit[0] is m:
            self._cache.move_to_end(id(m))
            return hit[1], hit[2]
        b = pack(m.to_wire())
        d = wire_digest(b)
        self._cache[id(m)] = (m, b, d)
        if len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return b, d


def packed_map(items: dict, raw: dict[str, bytes]) -> bytes:
    """msgpack of `items` plus `raw`'s values, which are msgpack already (a map is its entries in a row).
    `items` is packed in one call and its map header replaced (a call per key and value cost a plan
    reply ~15% of the hub's time in the fetch-cycle benchmark)."""
    body = pack(items)
    skip = _MAP_HEADER.get(body[0], 1)
    n = len(items) + len(raw)
    head = (bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big") if n < 1 << 16
            else b"\xdf" + n.to_bytes(4, "big"))
    return b"".join([head, memoryview(body)[skip:], *(pack(k) + b for k, b in raw.items())])


_MAP_HEADER = {0xde: 3, 0xdf: 5}  # map16 / map32 header sizes; a fixmap (0x80-0x8f) has 1


def park_until(wait_s) -> tuple[float, float]:
    """(now, the time by which a request the hub parks must be answered): 80% of the try time the client
    sent (`wait_s`), so the answer reaches it before it gives the try up; a client that sent none waits on."""
    now = time.monotonic()
    if isinstance(wait_s, (int, float)) and not isinstance(wait_s, bool) and 0 < wait_s < 1e6:
        return now, now + 0.8 * wait_s
    return now, float("inf")
