"""The hub server stops cleanly on SIGTERM/SIGINT and a restart on the same journal resumes.

On ea01902 `python -m rlsync.hub serve` died by the signal (exit -15) with its WAL un-checkpointed.
"""
import os
import signal
import sqlite3
import time

import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location
from rlsync.hub import errors as E
from rlsync.hub.tools.demo import start_hub_process
from rlsync.hub.server.loop import start_embedded_hub

from ports import free_port  # tests/ports.py

from waiting import wait_for  # tests/waiting.py

pytestmark = pytest.mark.timeout(120)
W = {"w": torch.arange(1024, dtype=torch.float32)}


def committed_in(journal: str) -> list[tuple[str, int]]:
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return db.execute("SELECT model, version FROM versions ORDER BY version").fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_hub_cleanly_and_a_restart_resumes(tmp_path, sig):
    port = free_port()
    proc, address, token = start_hub_process(str(tmp_path), port=port)
    journal = str(tmp_path / "journal.db")
    cfg = ClientConfig(rpc_timeout_s=2.0, hub_deadline_s=30.0, heartbeat_s=0.2)
    trainer, reader = HubClient(address, token, config=cfg), HubClient(address, token, config=cfg)
    try:
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        for v in (1, 2):
            trainer.publish("policy", v, {k: t + v for k, t in W.items()})
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        # Closed: the WAL was checkpointed into the database (SQLite removes it on a clean close).
        assert not os.path.exists(journal + "-wal") or os.path.getsize(journal + "-wal") == 0
        assert committed_in(journal) == [("policy", 1), ("policy", 2)]
        proc, address2, _ = start_hub_process(str(tmp_path), port=port)
        assert address2 == address
        # As after kill -9: the trainer re-registers v1 and v2 (it never stopped holding them; a fetch
        # racing that re-registration is issue #18's other half), and readers get them.
        wait_for(lambda: reader.stats()["replicas"] >= 2, 20, fail=False, every_s=0.05)
        got = reader.fetch("policy", 2)
        assert got.version == 2 and torch.equal(got.tensors["w"], W["w"] + 2)
        fresh = HubClient(address, token, config=cfg)
        fresh.join(Location(host="f"), "fresh")
        v = fresh.versions("policy")  # how to list committed versions (docs/integration.md)
        assert v["committed"] == [1, 2] and v["latest"] == 2 and v["held"] == [1, 2]
        with pytest.raises(E.VersionError, match="latest committed 2"):
            fresh.publish("policy", 2, {k: t.clone() for k, t in W.items()})  # numbers never reused
        fresh.leave()
        assert trainer.publish("policy", 3, {k: t + 3 for k, t in W.items()})
    finally:
        reader.leave()
        trainer.leave()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_embedded_hub_stop_closes_its_journal(tmp_path):
    journal = str(tmp_path / "j.db")
    hub = start_embedded_hub(journal=journal)
    c = HubClient(hub.address, hub.token)
    c.join(Location(host="t"))
    c.publish("policy", 1, W)
    c.leave()
    hub.stop()
    assert not hub.server._thread.is_alive()
    assert not os.path.exists(journal + "-wal") or os.path.getsize(journal + "-wal") == 0
    assert committed_in(journal) == [("policy", 1)]


def test_failover_deadline_applies_once_a_hub_answered(tmp_path):
    """A hub that answered once and then went away is waited for up to hub_deadline_s (a restart)."""
    hub = start_embedded_hub(journal=str(tmp_path / "j.db"))
    c = HubClient(hub.address, hub.token, config=ClientConfig(rpc_timeout_s=0.3, hub_deadline_s=1.5))
    c.join(Location(host="x"))
    hub.stop()
    t0 = time.monotonic()
    with pytest.raises(E.HubUnavailableError, match="gave up after .* tries"):
        c.stats()
    # It kept retrying well past one try (0.3 s), and gave up around its deadline (1.5 s; the last
    # back-off sleep that would overshoot it is skipped).
    assert 1.0 <= time.monotonic() - t0 < 5
    c.session.stop_heartbeat()
