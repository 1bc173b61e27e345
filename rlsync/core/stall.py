"""Stall clock: what every worker is doing, as intervals on a monotonic clock.

Every worker (trainer rank, rollout worker) owns one `StallClock`. The clock is always in exactly
one `State`; a transition closes the current interval and opens the next. The worker ships its
closed intervals and instant events to the driver with `drain()` (plain picklable tuples, so they
travel back through Ray actor return values), and the driver turns a step window of them into
seconds per state with `summarize()`.

    clock = StallClock("rollout-0", role="rollout", pool="spot")
    with clock.state("waiting_weights"):
        client.fetch("policy", "latest")          # time lands in waiting_weights
    clock.event("fetch", version=3, bytes=n, seconds=dt)
    clock.enter("generating")
    records = clock.drain()                       # -> [Interval, ..., Event, ...]

Timestamps: intervals are measured with `time.monotonic_ns()` (never jumps) and reported as
`monotonic + offset`, where the offset (wall minus monotonic) is fixed once per process. So within a
process time is monotonic, and records of processes on different hosts share one time base, as good
as the hosts' wall clocks. `now_ns()` gives the same time base to the driver for its window bounds.

Cost: a transition is a lock, two clock reads and one tuple append (about a microsecond), so the
clock stays on in every run. The buffer is bounded: if nobody drains, the oldest records are
dropped and counted in `dropped`.

Simplification: one writer thread per clock. `drain()` may run on another thread (a Ray actor's
concurrency group); a lock keeps the two consistent.
"""

from __future__ import annotations

import collections
import threading
import time
from contextlib import contextmanager
from enum import Enum
from typing import Any, Callable, Iterable, Iterator, NamedTuple

__all__ = [
    "State",
    "PRODUCTIVE_STATES",
    "Interval",
    "Event",
    "Record",
    "StallClock",
    "now_ns",
    "summarize",
]


class State(str, Enum):
    """What a worker is doing. `generating` and `training` are productive; the rest are stall."""

    GENERATING = "generating"
    TRAINING = "training"
    WAITING_WEIGHTS = "waiting_weights"
    LOADING_WEIGHTS = "loading_weights"
    WAITING_DATA = "waiting_data"
    RELEASING = "releasing"
    OFFLOADING = "offloading"
    IDLE = "idle"

    @classmethod
    def parse(cls, name: "str | State") -> "State":
        """`State.parse("idle") is State.IDLE`; an unknown name raises ValueError listing the valid ones."""
        if isinstance(name, State):
            return name
        try:
            return cls(name)
        except ValueError:
            valid = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown stall state {name!r}; valid states: {valid}") from None


PRODUCTIVE_STATES = frozenset({State.GENERATING.value, State.TRAINING.value})
"""States that do the work a worker exists for, whatever its role (a colocated worker does both)."""


class Interval(NamedTuple):
    """A worker spent [start_ns, end_ns) in `state` (a `State` value string)."""

    worker_id: str
    role: str
    pool: str | None
    state: str
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class Event(NamedTuple):
    """An instant at `ts_ns`: e.g. `publish` (version, bytes) or `fetch` (version, bytes, seconds)."""

    worker_id: str
    role: str
    pool: str | None
    name: str
    ts_ns: int
    attrs: dict[str, Any]


Record = Interval | Event

_OFFSET_NS = time.time_ns() - time.monotonic_ns()


def now_ns() -> int:
    """This process's monotonic clock on the shared (wall-clock) time base of every `StallClock`."""
    return time.monotonic_ns() + _OFFSET_NS


class StallClock:
    """One worker's state timeline. Starts in `initial` (idle); always exactly one current state."""

    def __init__(
        self,
        worker_id: str,
        role: str,
        pool: str | None = None,
        *,
        initial: str | State = State.IDLE,
        max_records: int = 100_000,
        clock: Callable[[], int] = now_ns,
    ) -> None:
        """`clock`: the time source in ns (default `now_ns`); a simulator or a test passes its own."""
        self.worker_id = str(worker_id)
        self.role = str(role)
        self.pool = pool
        self.dropped = 0
        """Records lost because the buffer was full (nobody drained)."""
        self._lock = threading.Lock()
        self._buf: collections.deque[Record] = collections.deque()
        self._max = max_records
        self._clock = clock
        self._state = State.parse(initial).value
        self._since = clock()

    @property
    def current(self) -> State:
        return State(self._state)

    def _append(self, rec: Record) -> None:
        if len(self._buf) >= self._max:
            self._buf.popleft()
            self.dropped += 1
        self._buf.append(rec)

    def enter(self, name: str | State) -> State:
        """Close the current interval and switch to `name`; returns the state left.

        Entering the current state is a no-op (the interval continues).
        """
        new = State.parse(name).value
        with self._lock:  # read the clock under the lock: a concurrent drain() must not reorder cuts
            t = self._clock()
            old = self._state
            if new != old:
                if t > self._since:
                    self._append(Interval(self.worker_id, self.role, self.pool, old, self._since, t))
                self._state, self._since = new, t
        return State(old)

    @contextmanager
    def state(self, name: str | State) -> Iterator[None]:
        """Be in `name` for the block, then go back to the state held before it (nests)."""
        previous = self.enter(name)
        try:
            yield
        finally:
            self.enter(previous)

    def event(self, name: str, **attrs: Any) -> Event:
        """Record an instant event now (attrs must be picklable plain values)."""
        with self._lock:
            ev = Event(self.worker_id, self.role, self.pool, str(name), self._clock(), dict(attrs))
            self._append(ev)
        return ev

    def drain(self) -> list[Record]:
        """Take every record so far, including the open interval cut at now.

        The open interval is split: its part up to now is returned and the state continues from
        now, so a worker waiting through a window boundary reports that wait on both sides of it.
        """
        with self._lock:
            t = self._clock()
            if t > self._since:
                self._append(Interval(self.worker_id, self.role, self.pool, self._state, self._since, t))
                self._since = t
            out = list(self._buf)
            self._buf.clear()
        return out


def summarize(records: Iterable[Record], window_start_ns: int, window_end_ns: int) -> dict[str, float]:
    """Seconds per state inside [window_start_ns, window_end_ns), intervals clipped to the window.

    Sums over every worker in `records` (filter first for one worker). Events are ignored. Every
    `State` appears in the result, zero when absent. Example: an interval of waiting_weights from
    0.5 s to 2.5 s contributes 0.5 s to the window [0 s, 1 s) and 1.5 s to [1 s, 3 s).
    """
    if window_end_ns < window_start_ns:
        raise ValueError(f"window ends before it starts: [{window_start_ns}, {window_end_ns})")
    ns = {s.value: 0 for s in State}
    for r in records:
        if not isinstance(r, Interval):
            continue
        lo = max(r.start_ns, window_start_ns)
        hi = min(r.end_ns, window_end_ns)
        if hi > lo:
            ns[r.state] += hi - lo
    return {k: v / 1e9 for k, v in ns.items()}
