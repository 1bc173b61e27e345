"""Data-plane shares: a source serves its readers' units by tenant weight (weighted fair queuing).

Several tenants' readers may read from one worker at once (a shared rollout pool, a seed worker).
Each read's ticket names the reader's tenant and weight (hub/server/tenancy.py); before sending a
unit, the connection asks this scheduler for one of the source's `slots` send slots. Start-time fair
queuing: a unit of `n` bytes of tenant c gets start tag max(virtual time, c's last finish tag) and
finish tag start + n / weight; the free slot goes to the smallest start tag. While several tenants
are backlogged each gets bytes in proportion to its weight, and a tenant that arrives late starts at
the current virtual time (no credit saved up while idle, no debt from another's burst): a full
refresh of one tenant's model cannot starve another's small push. Reads whose ticket names no tenant
(single-token hubs, the operator) never wait here.

`served` counts bytes granted per tenant; `contended` only those granted while another tenant was
waiting for a slot too (both backlogged): the shares a saturating co-tenant leaves
(python -m rlsync.bench tenants_hub).
"""
from __future__ import annotations

import heapq
import itertools
import threading
from collections import Counter


class ShareScheduler:
    def __init__(self, slots: int = 1) -> None:
        self.slots = max(1, slots)
        self._cv = threading.Condition()
        self._vtime = 0.0
        self._finish: dict[str, float] = {}
        self._queue: list[tuple[float, int, str]] = []  # (start tag, arrival, tenant)
        self._sending: Counter = Counter()  # tenant -> units being sent now
        self._seq = itertools.count()
        self.served: Counter = Counter()
        self.contended: Counter = Counter()

    def acquire(self, tenant: str, weight: float, nbytes: int) -> None:
        """Block until this unit's turn; call `release()` once it is sent (or failed)."""
        with self._cv:
            start = max(self._vtime, self._finish.get(tenant, 0.0))
            self._finish[tenant] = start + nbytes / weight
            me = (start, next(self._seq), tenant)
            heapq.heappush(self._queue, me)
            while self._queue[0] is not me or sum(self._sending.values()) >= self.slots:
                self._cv.wait()
            heapq.heappop(self._queue)
            self._vtime = start
            self._sending[tenant] += 1
            self.served[tenant] += nbytes
            if any(t != tenant for _, _, t in self._queue):  # another tenant is waiting for this slot too
                self.contended[tenant] += nbytes
            self._cv.notify_all()

    def release(self, tenant: str) -> None:
        with self._cv:
            self._sending[tenant] -= 1
            if not self._sending[tenant]:
                del self._sending[tenant]
            self._cv.notify_all()

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._cv:
            return {"served": dict(self.served), "contended": dict(self.contended)}
