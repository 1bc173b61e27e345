"""Issue 34 item 2: a source schedules tenants' unit sends by weight (start-time fair queuing,
hub/dataplane/shares.py): under saturation each tenant gets its weight's share, and a tenant that
arrives while another has been sending alone is served at once (no debt from the other's burst)."""
import threading
import time

import pytest

from rlsync.hub.dataplane.shares import ShareScheduler
from waiting import wait_for  # tests/waiting.py

pytestmark = pytest.mark.timeout(60)
UNIT = 1 << 20


def _sender(s: ShareScheduler, tenant: str, weight: float, units: int, start: threading.Barrier) -> None:
    start.wait()  # every stream starts together: all are backlogged from the first unit
    for _ in range(units):
        s.acquire(tenant, weight, UNIT)
        time.sleep(0.0001)  # the send itself (a socket write releases the GIL as this does)
        s.release(tenant)


@pytest.mark.parametrize("weights", [(3.0, 1.0), (16.0, 4.0), (1.0, 1.0)])
def test_backlogged_tenants_get_their_weights_share(weights):
    s, start = ShareScheduler(slots=1), threading.Barrier(4)
    threads = [threading.Thread(target=_sender, args=(s, t, w, 500, start), daemon=True)
               for t, w in zip("ab", weights) for _ in range(2)]  # two streams per tenant
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    got = s.snapshot()["contended"]
    share = got["a"] / (got["a"] + got["b"])
    want = weights[0] / sum(weights)
    assert abs(share - want) <= 0.02, (share, want, got)
    assert sum(s.snapshot()["served"].values()) == 4 * 500 * UNIT


def test_a_late_tenant_is_not_charged_for_the_others_solo_burst():
    s = ShareScheduler(slots=1)
    for _ in range(1000):  # a, alone, sends a full refresh
        s.acquire("a", 1.0, UNIT)
        s.release("a")
    order, lock = [], threading.Lock()

    def send(t, n):
        for _ in range(n):
            s.acquire(t, 1.0, UNIT)
            with lock:
                order.append(t)
            s.release(t)

    s.acquire("a", 1.0, UNIT)  # hold the slot so both queue behind it
    ta = threading.Thread(target=send, args=("a", 20))
    tb = threading.Thread(target=send, args=("b", 3))
    ta.start()
    tb.start()
    wait_for(lambda: len(s._queue) == 2, 10, "both tenants queued behind the held slot")
    s.release("a")
    ta.join(10)
    tb.join(10)
    assert "b" in order[:3] and order.index("b") <= 2, order  # b's small push goes within a unit or two
    assert order.count("b") == 3 and max(i for i, t in enumerate(order) if t == "b") <= 8, order
