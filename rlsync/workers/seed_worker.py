"""`SeedWorker`: a seed worker for one DC (`role="seed", follow=True`) as a Ray actor."""

from __future__ import annotations

from typing import Any

from rlsync.core.events import FetchEvent
from rlsync.core.stall import StallClock
from rlsync.workers.process import HubAccess, LocationConfig, ProcessSetup, hub_client, process_setup, with_telemetry


@with_telemetry
class SeedWorker:
    """A seed worker for one DC (`role="seed", follow=True`): keeps `latest` there, takes hand-offs.

    The hub client fetches in its own thread; its `on_fetch` hook records each of those fetches as a
    `fetch` event so the bytes it pulls (the DC crossing) show in `sync/*` like every reader's.
    """

    def __init__(self, dc: str, *, hub: HubAccess, setup: ProcessSetup):
        process_setup(setup, f"seed-{dc}")
        self.worker_id = f"seed-{dc}"
        self.clock = StallClock(self.worker_id, role="seed", pool=self.worker_id)
        self.hub = hub_client(hub, LocationConfig(dc=dc, rack="seed", host=self.worker_id), self.worker_id,
                              role="seed", follow=True, on_fetch=self._record)

    def _record(self, got) -> None:
        ev = FetchEvent.from_result(got, wid=self.hub.worker_id, dc=self.hub.location.dc)
        self.clock.event(FetchEvent.NAME, **ev.attrs())

    def info(self) -> dict[str, Any]:
        return {"worker": self.worker_id, "wid": self.hub.worker_id, "dc": self.hub.location.dc}

    def shutdown(self, deadline_s: float = 0.0) -> None:
        self.hub.leave(deadline_s=deadline_s)
