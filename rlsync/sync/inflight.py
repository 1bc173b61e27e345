"""In-flight updates, the receiver's part (`sync.inflight=true` with an engine whose `EngineCaps.inflight`):
each version is staged the moment it commits, while the engine keeps generating; the engine switches to
it at its next decode-step boundary. Nothing drains.

    follower = InflightFollower(hub, "policy", engine, caps, clock, wait_s=30.0)
    follower.start()              # one parked `wait_latest` at a time: wakes when a newer version commits
    follower.wait_staged(v, t)    # the staleness bound needs v now: wait until it is staged
    follower.close()

Staging a version is the engine's way (`EngineCaps.inflight`): an engine that reads the hub itself (vLLM)
fetches it into its host staging and builds it beside its live kernels (`stage_version`); for one the hub
fetches into (hf), the follower fetches into the engine's spare buffers (`next_buffers`) and hands them
over (`offer_next`). Either way the decode pause is the engine's reference swap, recorded as an
`engine_update` event with `in_flight=True` when the receiver drains `take_switches()`.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rlsync.core.events import FetchEvent
from rlsync.sync.stage_priority import StagePriority

log = logging.getLogger(__name__)


class InflightFollower:
    def __init__(self, hub: Any, model: str, engine: Any, caps: Any, clock: Any, wait_s: float, nice: int = 0,
                 escalate_s: float = 0.0):
        self.hub, self.model, self.engine, self.caps, self.clock = hub, model, engine, caps, clock
        self.wait_s = wait_s
        self.priority = StagePriority(nice, escalate_s)
        """The staging's priority: lowered in the follower, raised while a caller waits or past escalate_s."""
        self.raised: set[int] = set()
        """Versions whose staging was raised (the receiver reports each with its switch, then forgets it)."""
        self.staged = -1
        """Newest version staged (built beside the live weights, or fetched into the spare buffers)."""
        self.error: BaseException | None = None
        self.last_sources: dict[str, int] = {}
        """Hub worker id -> bytes it served to the last version staged (an engine that reads the hub itself
        reports them with its switch: the receiver puts them here)."""
        self.manifest = None
        """The manifest of the last version fetched into the spare buffers (an engine the hub fetches into)."""
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.priority.start()  # its watchdog starts here, at the caller's priority
        self._thread = threading.Thread(target=self._loop, name="rlsync-inflight-follow", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from rlsync.hub import errors as E

        self.priority.lower()  # threads started from here (an engine's fetch and build) inherit it
        while not self._stop.is_set():
            want = max(self.staged, self.engine.version) + 1
            try:
                latest = self.hub.wait_latest(self.model, want, min(self.wait_s, 1.0))  # 1 s: close() stays quick
                if self._stop.is_set() or latest is None or latest < want:
                    continue
                with self.priority.staging():
                    got = self._stage(latest)
                if got is not None and self.priority.raised_last:
                    self.raised.add(got)
            except E.UnknownModelError:  # nothing published yet
                self._stop.wait(0.05)
                continue
            except Exception as e:  # noqa: BLE001 - surfaced to the next wait_staged; the loop retries
                log.warning("in-flight staging of %s failed: %s", self.model, e)
                with self._cond:
                    self.error = e
                    self._cond.notify_all()
                self._stop.wait(0.2)
                continue
            with self._cond:
                if got is not None and got > self.staged:
                    self.staged, self.error = got, None
                self._cond.notify_all()

    def _stage(self, version: int) -> int | None:
        if self.caps.staged:
            return self.engine.stage_version(version)  # its sources come with its switch (`take_switches`)
        bufs = self.engine.next_buffers()
        r = self.hub.fetch(self.model, version, into=bufs)
        self.manifest = r.manifest  # what the verifier compares the switched-in buffers with (verify.py)
        self.engine.offer_next(r.version)
        self.last_sources = dict(r.bytes_by_source)
        ev = FetchEvent.from_result(r, wid=self.hub.worker_id, dc=self.hub.location.dc)
        self.clock.event(FetchEvent.NAME, **ev.attrs())
        return r.version

    def wait_staged(self, version: int, timeout_s: float) -> bool:
        """Until a version >= `version` is staged (True), or `timeout_s` passes (False). Re-raises a
        staging error that happened meanwhile."""
        deadline = time.monotonic() + timeout_s
        if self.staged < version:  # the engine needs it now: an idle staging must not wait for a free core
            self.priority.escalate(f"a caller waits for v{version}")
        with self._cond:
            while self.staged < version:
                if self.error is not None:
                    err, self.error = self.error, None
                    raise err
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.priority.close()
