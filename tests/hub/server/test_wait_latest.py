"""`wait_latest(model, at_least, timeout_s)`: one parked call instead of polling `latest` (hub/server/waits.py).

Answered in the loop pass that commits the version; at the timeout with `latest` as it is (no error);
bad arguments refused typed with nothing parked; across a hub restart the call is sent again and
answered by the new hub, and a hub that never comes back is HubUnavailableError, never a hang.
"""
import math
import os
import signal
import threading
import time

import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location
from rlsync.hub import errors as E
from rlsync.hub.tools.demo import start_hub_process

from ports import free_port  # tests/ports.py

pytestmark = pytest.mark.timeout(180)
W = {"w": torch.arange(64, dtype=torch.float32)}


class Waiter(threading.Thread):
    """`client.wait_latest(...)` on a thread: its answer (or error) and when it came."""

    def __init__(self, client, *args, **kw):
        super().__init__(daemon=True)
        self.client, self.args, self.kw = client, args, kw
        self.result = self.error = self.done_at = None
        self.start()

    def run(self):
        try:
            self.result = self.client.wait_latest(*self.args, **self.kw)
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            self.error = e
        self.done_at = time.monotonic()


def parked(hub, model="policy") -> int:
    return len(hub.server._waits.get(model, []))


def test_answered_in_the_pass_that_commits_the_version(hub, make_client, wait_until):
    trainer = make_client(host="t", name="trainer")
    reader = make_client(host="r", name="reader")
    trainer.publish("policy", 1, W)
    assert reader.wait_latest("policy", 1, timeout_s=30) == 1     # already there: answered at once
    w = Waiter(reader, "policy", 2, timeout_s=60)
    wait_until(lambda: parked(hub) == 1, what="the wait parked at the hub")
    assert w.done_at is None                                       # v2 not committed: still parked
    trainer.release("policy", 1)
    w2 = {"w": W["w"] + 1}
    t0 = time.monotonic()
    trainer.publish("policy", 2, w2)
    w.join(30)
    assert w.error is None and w.result == 2
    assert w.done_at - t0 < 5.0                                    # at the commit, not at the 60 s timeout
    assert parked(hub) == 0


def test_answered_at_the_timeout_with_latest_as_it_is_and_no_error(hub, make_client):
    trainer = make_client(host="t", name="trainer")
    reader = make_client(host="r", name="reader", join=False)      # a query: no join needed
    trainer.publish("policy", 1, W)
    for model, want in (("policy", 1), ("nothing-yet", None)):
        t0 = time.monotonic()
        assert reader.wait_latest(model, 5, timeout_s=0.5) == want
        assert 0.5 <= time.monotonic() - t0 < 5.0
        assert parked(hub, model) == 0
    assert reader.wait_latest("policy", 5, timeout_s=0) == 1       # 0: no wait, just latest


@pytest.mark.parametrize("args, named", [
    (("a:b", 1, 1.0), "model"), (("policy", -1, 1.0), "at_least"), (("policy", 2**70, 1.0), "at_least"),
    (("policy", "2", 1.0), "at_least"), (("policy", True, 1.0), "at_least"), (("policy", 2, -1), "timeout_s"),
    (("policy", 2, math.nan), "timeout_s"), (("policy", 2, 601), "timeout_s"), (("policy", 2, "1"), "timeout_s"),
    (("policy", 2, None), "timeout_s")])
def test_bad_arguments_are_refused_typed_and_nothing_is_parked(hub, make_client, args, named):
    trainer = make_client(host="t", name="trainer")
    trainer.publish("policy", 1, W)
    before = trainer.stats()["rpc_by_op"]
    with pytest.raises(E.InvalidArgumentError, match=f"wait_latest: {named}"):
        trainer.wait_latest(*args)
    assert trainer.stats()["rpc_by_op"].get("wait_latest", 0) == before.get("wait_latest", 0)  # refused client-side
    assert hub.server._waits == {}


@pytest.fixture
def hub_proc(tmp_path):
    procs = []

    def start(port):
        p, address, token = start_hub_process(str(tmp_path), port=port)
        procs.append(p)
        return p, address, token

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_hub_restart_while_parked_is_answered_by_the_new_hub(hub_proc, wait_until):
    port = free_port()
    proc, address, token = hub_proc(port)
    cfg = ClientConfig(transport="tcp-py", hub_deadline_s=60.0)
    trainer = HubClient(address, token, config=cfg)
    reader = HubClient(address, token, config=cfg)
    try:
        trainer.join(Location(host="t"), "trainer")
        trainer.publish("policy", 1, W)
        assert reader.wait_latest("policy", 1, timeout_s=5) == 1  # the reader's channel has been answered
        w = Waiter(reader, "policy", 2, timeout_s=60)
        wait_until(lambda: trainer.stats()["rpc_by_op"].get("wait_latest") == 2, what="the wait parked")
        os.kill(proc.pid, signal.SIGKILL)                           # kill -9 with the reply parked
        proc.wait()
        proc2, _, _ = hub_proc(port)                                # same port, same journal: v1 restored
        publisher = HubClient(address, token, config=cfg)
        publisher.join(Location(host="p"), "publisher")
        publisher.publish("policy", 2, {"w": W["w"] + 1})
        w.join(90)
        assert not w.is_alive(), "wait_latest hung across the restart"
        assert w.error is None and w.result == 2
        publisher.leave()
    finally:
        trainer.leave()
        reader.leave()


def test_a_hub_that_does_not_come_back_is_a_typed_error_not_a_hang(hub_proc, wait_until):
    proc, address, token = hub_proc(free_port())
    reader = HubClient(address, token, config=ClientConfig(rpc_timeout_s=1.0, hub_deadline_s=3.0))
    probe = HubClient(address, token, config=ClientConfig(rpc_timeout_s=1.0, hub_deadline_s=3.0))
    try:
        assert reader.wait_latest("policy", 1, timeout_s=0) is None  # answered once: failover rules apply
        w = Waiter(reader, "policy", 1, timeout_s=2.0)
        wait_until(lambda: probe.stats()["rpc_by_op"].get("wait_latest") == 2, what="the wait parked")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        w.join(60)
        assert not w.is_alive(), "wait_latest hung on a dead hub"
        assert isinstance(w.error, E.HubUnavailableError), w.error
    finally:
        reader.leave()
        probe.leave()
