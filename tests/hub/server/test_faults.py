"""Faults with real processes: sources dying or stalling mid-transfer, spot loss with and without
notice, and kill -9 of the hub itself. Nothing torn, nothing stale, nothing lost that had a copy."""
import os
import signal
import time

import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub import errors as E
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.tools.demo import start_hub_process
from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.tools.fakes import digest
from rlsync.hub.tools.procs import WorkerError, WorkerProcess, close_all
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state import HubConfig

from ports import free_port  # tests/ports.py

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def procs():
    made = []

    def make(address, token, name, slow_s=0.0, io_timeout_s=30.0, hub_deadline_s=60.0):
        cfg = ClientConfig(dataplane=DataPlaneConfig(serve_delay_s=slow_s, io_timeout_s=io_timeout_s),
                           transport="tcp-py", manifest=ManifestConfig(chunk_bytes=1 << 20),
                           hub_deadline_s=hub_deadline_s)
        w = WorkerProcess(address, token, cfg, name=name)
        made.append(w)
        return w

    yield make
    for w in made:  # un-stop anything a test SIGSTOPped, then close
        try:
            os.kill(w.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    close_all(made)


def two_sources_one_slow(hub, procs, **kw):
    """trainer publishes; `a` fetches it fully; `b` will read from the slow `a` (same rack)."""
    trainer = procs(hub.address, hub.token, "trainer")
    a = procs(hub.address, hub.token, "a", slow_s=0.05)
    b = procs(hub.address, hub.token, "b", **kw)
    trainer.join(rack="r-train", host="t")
    a.join(rack="r-roll", host="a")
    b.join(rack="r-roll", host="b")
    pub = trainer.call("publish", model="policy", version=1, size_mb=16, seed=21)
    assert a.call("fetch", model="policy")["digest"] == pub["digest"]
    return trainer, a, b, pub


def reading_from(w) -> bool:
    """Some reader is being served by worker `w` right now."""
    return any(x["readers"] for x in w.call("served").values())


def test_source_killed_mid_transfer_replans_missing_units(procs, wait_until):
    with start_embedded_hub(config=HubConfig(planner=PlannerConfig(max_sources=1))) as hub:
        trainer, a, b, pub = two_sources_one_slow(hub, procs)
        tag = b.start("fetch", model="policy")
        wait_until(lambda: reading_from(a), what="b reading from a")  # same rack beats the trainer's rack
        a.kill()                 # kill -9
        got = b.wait(tag)
        assert got["digest"] == pub["digest"]
        assert got["bytes_by_source"][a.wid] < got["nbytes"]        # a sent part of it ...
        assert got["bytes_by_source"][trainer.wid] > 0               # ... the trainer the rest
        assert sum(got["bytes_by_source"].values()) == got["nbytes"]  # only the missing units again


def test_stalled_source_past_deadline_is_replanned(procs, wait_until):
    with start_embedded_hub(config=HubConfig(planner=PlannerConfig(max_sources=1))) as hub:
        trainer, a, b, pub = two_sources_one_slow(hub, procs, io_timeout_s=1.5)
        tag = b.start("fetch", model="policy")
        wait_until(lambda: reading_from(a), what="b reading from a")
        os.kill(a.proc.pid, signal.SIGSTOP)   # alive but silent
        got = b.wait(tag)
        assert got["digest"] == pub["digest"] and got["bytes_by_source"][trainer.wid] > 0
        assert any(f.endswith(":live") for f in hub.server.state.suspects)


def test_sole_holder_killed_without_notice_version_lost_never_torn(tmp_path, procs, wait_until):
    proc, address, token = start_hub_process(str(tmp_path), worker_timeout_s=2.0, reregister_grace_s=1.0)
    try:
        trainer = procs(address, token, "trainer")
        old = procs(address, token, "old-reader")
        trainer.join(host="t")
        old.join(host="o")
        v1 = trainer.call("publish", model="policy", version=1, size_mb=2, seed=1)
        old.call("fetch", model="policy")
        trainer.call("publish", model="policy", version=2, size_mb=2, seed=2, buf="v2")
        trainer.kill()  # the only holder of v2 dies with no notice
        reader = HubClient(address, token)
        reader.join(Location(host="r"))
        wait_until(lambda: reader.stats()["workers"] == 2, what="the hub expiring the trainer")  # old-reader, reader
        with pytest.raises(E.VersionLostError):
            reader.fetch("policy", 2)        # v2 is lost (after the 1 s grace for the trainer to come back)
        # 'latest' is the newest version someone can serve (issue 30): v1, labelled v1, v1's bytes
        got = reader.fetch("policy")
        assert got.version == 1 and digest(got.tensors) == v1["digest"]
        reader.leave()
    finally:
        proc.kill()
        proc.wait()


def test_spot_leave_with_notice_hands_off_to_a_seed_worker(procs):
    with start_embedded_hub() as hub:
        spot = procs(hub.address, hub.token, "spot")
        seed = procs(hub.address, hub.token, "seed")
        reader = procs(hub.address, hub.token, "reader")
        spot.join(host="s")
        seed.join(host="seed", role="seed")
        reader.join(host="r")
        pub = spot.call("publish", model="policy", version=4, size_mb=8, seed=3)
        spot.call("leave", deadline_s=30.0)   # preemption notice: retention runs first
        spot.close()
        got = reader.call("fetch", model="policy")
        assert got["version"] == 4 and got["digest"] == pub["digest"]
        assert list(got["bytes_by_source"]) == [seed.wid]


def test_hub_kill9_restart_recovers_workers_and_never_reuses_versions(tmp_path, procs, wait_until):
    port = free_port()
    proc, address, token = start_hub_process(str(tmp_path), port=port)
    try:
        trainer = procs(address, token, "trainer", slow_s=0.03)
        midway = [procs(address, token, f"m{i}") for i in range(4)]
        r2 = procs(address, token, "r2")
        trainer.join(host="t")
        for i, m in enumerate(midway):
            m.join(host=f"m{i}")
        r2.join(host="b")
        pub = trainer.call("publish", model="policy", version=1, size_mb=16, seed=7)
        tags = [m.start("fetch", model="policy") for m in midway]
        # every reader has its plan (its relay is registered) and the trainer is serving
        wait_until(lambda: all(m.call("served") for m in midway) and reading_from(trainer), what="mid-fetch")
        proc.kill()                      # kill -9 of the hub while 4 readers are mid-fetch
        proc.wait()
        proc, address2, _ = start_hub_process(str(tmp_path), port=port)  # same address, same journal
        assert address2 == address
        for m, tag in zip(midway, tags):  # planned transfers finish: the data plane needs no hub
            assert m.wait(tag)["digest"] == pub["digest"]
        # The restarted hub knows no replica until workers re-register: the fetch waits for them.
        got2 = r2.call("fetch", model="policy")
        assert got2["version"] == 1 and got2["digest"] == pub["digest"]
        fresh = HubClient(address, token)
        fresh.join(Location(host="fresh"))
        with pytest.raises(E.VersionError, match="latest committed 1"):
            fresh.publish("policy", 1, {"w": torch.zeros(4)})  # the restarted hub remembers v1
        fresh.leave()
        assert trainer.call("publish", model="policy", version=2, size_mb=1, seed=9, buf="y")["committed"]
    finally:
        proc.kill()
        proc.wait()


def test_replan_never_routes_to_a_downstream_relay():
    from rlsync.hub.model.manifest import build_manifest
    from rlsync.hub.model.shard import Shard
    from rlsync.hub.state import HubState
    s = HubState(HubConfig(planner=PlannerConfig(fanout_cap=1, max_sources=1)))
    w = {n: s.join(n, Location(host=n), {}) for n in ("t", "a", "b")}
    m = build_manifest({"w": torch.zeros(64)}, ManifestConfig(chunk_bytes=16, pack_below=0))
    s.publish(w["t"], "p", 1, Shard(), m)
    fa = s.plan_fetch(w["a"], "p", 1, Shard())
    fb = s.plan_fetch(w["b"], "p", 1, Shard())          # b relays from a
    assert fb.sources[0][1].id == w["a"]
    # a's source (the trainer) fails: b is downstream of a, so it must not be a's new source.
    with pytest.raises(E.VersionLostError):
        s.replan(w["a"], fa.fetch_id, [fa.sources[0][0].id], [0, 1, 2, 3])
