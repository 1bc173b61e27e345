"""Discrete-event core: a clock, timed callbacks, and flows sharing links max-min fairly.

    eng = Engine(net)
    eng.at(0.5, lambda: eng.start(Flow(net.path("a", "b"), 64e6, on_done=print)))
    eng.run()

Time jumps from one event to the next: a callback falls due, a flow completes, or a relay flow
changes regime. Rates are recomputed (`fairshare.max_min_rates`) whenever a flow starts or ends and
whenever a relay flow catches up with, or falls behind, its upstream: a fluid model, exact for
piecewise-constant rates.

Pipelined relays (DESIGN.md §2): a flow that reads from a replica still being fetched (its
`upstream` Transfer) may hold at most what the upstream holds minus one transfer unit (`lag`): the
relay serves a unit once it has all of it. Until the upstream holds one unit, the flow waits; once
it has caught up, its rate is capped at the upstream's (a chain of k relays ends k units after its
head, as measured on the emulator). When the upstream completes, the cap goes.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable

from .fairshare import max_min_rates
from .network import Network

MAX_RATE_PASSES = 64


@dataclass(eq=False, slots=True)
class Transfer:
    """One reader's fetch of one shard: the bytes it needs, the bytes it holds so far."""
    total: float
    got: float = 0.0
    rate: float = 0.0
    done: bool = False
    flows: list = field(default_factory=list)

    @property
    def frac(self) -> float:
        return 1.0 if self.done or self.total <= 0 else min(1.0, self.got / self.total)


@dataclass(eq=False, slots=True)
class Flow:
    links: tuple[str, ...]
    nbytes: float
    on_done: Callable[["Flow"], None] | None = None
    owner: Transfer | None = None
    """The reader's transfer this flow fills (its progress is what downstream relays read)."""
    upstream: Transfer | None = None
    """The source's own transfer when the source is a relay still receiving; None for a full source."""
    lag: float = 0.0
    """Bytes the flow stays behind its upstream (one transfer unit)."""
    cap: float | None = None
    """Its own rate limit (bytes/s) besides the links, e.g. a store's copy rate; None = none."""
    got: float = 0.0
    rate: float = 0.0
    started: float = 0.0
    id: int = 0

    def frontier(self) -> tuple[float, float]:
        """(bytes this flow may hold now, how fast that bound grows in bytes/s)."""
        front, grows, _ = self.bound()
        return front, grows

    def waiting(self) -> bool:
        """The upstream does not hold this flow's first unit yet."""
        return self.bound()[2]

    def bound(self) -> tuple[float, float, bool]:
        """(frontier, its growth rate, waiting for the upstream's first unit) in one pass."""
        up = self.upstream
        if up is None or up.done:
            return self.nbytes, 0.0, False
        n = self.nbytes
        scale = n / up.total if up.total > 0 else 0.0
        have = min(1.0, up.got / up.total) * n if up.total > 0 else n
        if have < self.lag - (1e-9 * n + 1e-6):
            return 0.0, 0.0, True
        return max(0.0, min(n, have - self.lag)), up.rate * scale, False


class Engine:
    def __init__(self, net: Network) -> None:
        self.net = net
        self.now = 0.0
        self._q: list = []
        self._seq = itertools.count()
        self.flows: dict[int, Flow] = {}
        self._dirty = False
        self._cap_cache: dict[str, float] = {}
        self.events = 0
        self.rate_passes = 0

    # ---------------------------------------------------------------- scheduling
    def at(self, delay: float, fn: Callable, *args) -> None:
        """Run `fn(*args)` `delay` seconds from now (ties run in the order they were scheduled)."""
        if not delay >= 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        heapq.heappush(self._q, (self.now + delay, next(self._seq), fn, args))

    def start(self, flow: Flow) -> Flow:
        flow.id = next(self._seq)
        flow.started = self.now
        self.flows[flow.id] = flow
        if flow.owner is not None:
            flow.owner.flows.append(flow)
        self._dirty = True
        return flow

    def cancel(self, flow: Flow) -> float:
        """Stop a flow (its source or reader died); returns the bytes it delivered."""
        if self.flows.pop(flow.id, None) is not None:
            self._dirty = True
            if flow.owner is not None and flow in flow.owner.flows:
                flow.owner.flows.remove(flow)
                flow.owner.rate -= flow.rate
        flow.rate = 0.0
        return flow.got

    # ---------------------------------------------------------------- the loop
    def run(self, until: float = math.inf, max_events: int = 10_000_000) -> float:
        """Advance until nothing is left to do (or `until`); returns the time reached."""
        for _ in range(max_events):
            if self._dirty:
                self._rates()
            t_ev = self._q[0][0] if self._q else math.inf
            t_fl = self.now + self._next_flow_event()
            t = min(t_ev, t_fl)
            if t == math.inf:
                return self.now
            if t > until:
                self._advance(until - self.now)
                self.now = until
                return self.now
            self._advance(t - self.now)
            self.now = max(self.now, t)
            self.events += 1
            if t_fl <= t_ev:
                self._dirty = True
                for f in [f for f in self.flows.values() if f.nbytes - f.got <= _tol(f.nbytes)]:
                    self._complete(f)
            while self._q and self._q[0][0] <= self.now:
                _, _, fn, args = heapq.heappop(self._q)
                fn(*args)
        raise RuntimeError(f"simulation did not settle within {max_events} events (t={self.now:.3f}s)")

    def _complete(self, f: Flow) -> None:
        f.got = f.nbytes
        del self.flows[f.id]
        if f.owner is not None:
            f.owner.flows.remove(f)
            f.owner.rate -= f.rate
        f.rate = 0.0
        if f.on_done is not None:
            f.on_done(f)

    def _advance(self, dt: float) -> None:
        if dt <= 0:
            return
        relays = []
        for f in self.flows.values():
            if f.rate > 0:
                inc = min(f.rate * dt, f.nbytes - f.got)
                f.got += inc
                if f.owner is not None:
                    f.owner.got += inc
                if f.upstream is not None:
                    relays.append(f)
        # Rounding only: a relay flow never holds more than its upstream lets it (after both moved).
        for f in relays:
            over = f.got - (f.frontier()[0] + _tol(f.nbytes))
            if over > 0:
                f.got -= over
                if f.owner is not None:
                    f.owner.got -= over

    def _next_flow_event(self) -> float:
        best = math.inf
        for f in self.flows.values():
            left = f.nbytes - f.got
            if left <= _tol(f.nbytes):
                return 0.0
            if f.rate > 0:
                best = min(best, left / f.rate)
            up = f.upstream
            if up is None or up.done:
                continue
            front, grows, waiting = f.bound()
            if waiting:  # waiting for the upstream's first unit
                if grows > 0 or up.rate > 0:
                    scale = f.nbytes / up.total if up.total > 0 else 0.0
                    if scale > 0:
                        best = min(best, max(0.0, (f.lag - up.frac * f.nbytes)) / (up.rate * scale))
                continue
            gap = front - f.got
            if gap > _tol(f.nbytes) and f.rate > grows:  # free, and catching up
                best = min(best, gap / (f.rate - grows))
        return best

    def _rates(self) -> None:
        """Max-min fair rates; a relay flow that caught up is capped at its upstream's rate (fixed point)."""
        self._dirty = False
        flows = list(self.flows.values())
        caps = {}
        links = {link for f in flows for link in f.links}
        for link in links:
            if link not in self._cap_cache:
                self._cap_cache[link] = self.net.capacity(link)
            caps[link] = self._cap_cache[link]
        # Each relay flow's regime is fixed for this instant: free, waiting (cap 0), or caught up
        # (capped at its upstream's rate, which the passes below settle: a fixed point).
        fixed: dict[int, float | None] = {}
        caught: list[tuple[Flow, float]] = []
        for f in flows:
            up = f.upstream
            if up is None or up.done:
                fixed[f.id] = f.cap
                continue
            front, _, waiting = f.bound()
            if waiting:
                fixed[f.id] = 0.0
            elif f.got < front - _tol(f.nbytes):
                fixed[f.id] = f.cap
            else:
                caught.append((f, f.nbytes / up.total if up.total > 0 else 0.0))
        owners = {id(f.owner): f.owner for f in flows if f.owner is not None}
        for _ in range(MAX_RATE_PASSES):
            self.rate_passes += 1
            spec = {f.id: (f.links, fixed[f.id]) for f in flows if f.id in fixed}
            for f, scale in caught:
                c = f.upstream.rate * scale
                spec[f.id] = (f.links, c if f.cap is None else min(c, f.cap))
            new = max_min_rates(spec, caps)
            changed = False
            for f in flows:
                r = new[f.id]
                if abs(r - f.rate) > 1e-9 * max(1.0, r):
                    changed = True
                f.rate = r
            for o in owners.values():
                o.rate = sum(x.rate for x in o.flows)
            if not changed or not caught:
                return


def _tol(nbytes: float) -> float:
    return 1e-9 * nbytes + 1e-6
