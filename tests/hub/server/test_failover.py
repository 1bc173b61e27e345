"""A version is never reported lost or not-retained while a live replica exists: sources dying a few
milliseconds into a fetch, a hub restart (replicas re-register; fetches wait for them), and a fetch
the hub forgot across a restart or re-join. Real processes, kill -9."""
import os
import signal
import time

import pytest

from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.tools.demo import start_hub_process
from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.tools.procs import WorkerProcess, close_all
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state import HubConfig

from ports import free_port  # tests/ports.py
from waiting import wait_for  # tests/waiting.py

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def procs():
    made = []

    def make(address, token, name, slow_s=0.0, heartbeat_s=1.0, io_timeout_s=5.0):
        cfg = ClientConfig(dataplane=DataPlaneConfig(serve_delay_s=slow_s, io_timeout_s=io_timeout_s),
                           transport="tcp-py", manifest=ManifestConfig(chunk_bytes=1 << 20),
                           hub_deadline_s=30.0, heartbeat_s=heartbeat_s)
        w = WorkerProcess(address, token, cfg, name=name)
        made.append(w)
        return w

    yield make
    close_all(made)


def test_holder_killed_milliseconds_into_a_fetch_replans_to_the_trainer(procs):
    """The reader's only planned source dies 10-25 ms into its fetch: the trainer, alive, serves the rest."""
    kills_ms = [10, 15, 20, 25]
    with start_embedded_hub(config=HubConfig(planner=PlannerConfig(max_sources=1))) as hub:
        trainer = procs(hub.address, hub.token, "trainer")
        holders = [procs(hub.address, hub.token, f"holder{i}", slow_s=0.005) for i in range(len(kills_ms))]
        reader = procs(hub.address, hub.token, "reader")
        trainer.join(rack="r-train", host="t")
        for i, h in enumerate(holders):
            h.join(rack="r-roll", host=f"h{i}")
        reader.join(rack="r-roll", host="r")
        for v, (h, ms) in enumerate(zip(holders, kills_ms), start=1):
            pub = trainer.call("publish", model="policy", version=v, size_mb=8, seed=v, buf=f"v{v}")
            assert h.call("fetch", model="policy", version=v)["digest"] == pub["digest"]
            tag = reader.start("fetch", model="policy", version=v, buf=f"r{v}")
            time.sleep(ms / 1000)   # the fault's schedule, not a synchronization
            h.kill()                # kill -9: the reader's planned source (peers before origin)
            got = reader.wait(tag)
            assert got["version"] == v and got["digest"] == pub["digest"]
            assert got["bytes_by_source"].get(trainer.wid, 0) > 0


def test_the_trainer_keeps_its_copy_while_one_reader_holds_it_so_that_readers_kill_loses_nothing(procs):
    """Issue 18's chaos loss: the trainer released v once ONE reader held it in full and overwrote its
    buffers; that reader was kill -9'd and v was gone. With retention.min_full_copies=2 the release
    offload-seeds first (it does not block): after the kill a new reader still gets v's exact bytes."""
    with start_embedded_hub() as hub:
        trainer, reader, late = (procs(hub.address, hub.token, n) for n in ("trainer", "reader", "late"))
        for i, w in enumerate((trainer, reader, late)):
            w.join(host=f"h{i}")
        pub = trainer.call("publish", model="policy", version=1, size_mb=2, seed=7)
        assert reader.call("fetch", model="policy", version=1)["digest"] == pub["digest"]
        trainer.call("release", model="policy", version=1)
        assert trainer.call("overwrite", value=-3.0) != pub["digest"]   # the optimizer step, in place
        assert any(h.endswith(":seed") for h in trainer.call("held"))  # the origin's copy, in host memory
        reader.kill()                                                   # kill -9 the one reader-held copy
        got = late.call("fetch", model="policy", version=1)
        assert got["version"] == 1 and got["digest"] == pub["digest"]
        assert got["bytes_by_source"].get(trainer.wid, 0) > 0


def test_fetch_right_after_a_hub_restart_waits_for_re_registration(tmp_path, procs):
    """kill -9 of the hub: a fetch the moment it is back gets the trainer's versions, never
    'no worker holds it' (the trainer held them throughout and re-registers within the grace)."""
    port = free_port()
    proc, address, token = start_hub_process(str(tmp_path), port=port)
    try:
        trainer = procs(address, token, "trainer")
        trainer.join(host="t")
        pub1 = trainer.call("publish", model="policy", version=1, size_mb=2, seed=1, buf="v1")
        pub2 = trainer.call("publish", model="policy", version=2, size_mb=2, seed=2, buf="v2")
        reader = HubClient(address, token, config=ClientConfig(hub_deadline_s=30.0))
        reader.join(Location(host="r"))
        proc.kill()
        proc.wait()
        proc, _, _ = start_hub_process(str(tmp_path), port=port)
        got1 = reader.fetch("policy", 1)   # v1 is no longer `latest`: held by the trainer only
        got2 = reader.fetch("policy", "latest")
        assert (got1.version, got2.version) == (1, 2)
        from rlsync.hub.tools.fakes import digest
        assert digest(got1.tensors) == pub1["digest"] and digest(got2.tensors) == pub2["digest"]
        assert set(got1.bytes_by_source) == set(got2.bytes_by_source) == {trainer.wid}
        reader.leave()
    finally:
        proc.kill()
        proc.wait()


def test_fetch_the_hub_forgot_in_a_restart_replans_when_its_source_dies(tmp_path, procs, wait_until):
    """A reader mid-fetch across a hub restart, then its source dies: the restarted hub never heard of
    that fetch, so the reader plans it anew (from the trainer) instead of failing 'unknown fetch'."""
    port = free_port()
    proc, address, token = start_hub_process(str(tmp_path), port=port)
    try:
        trainer = procs(address, token, "trainer")
        a = procs(address, token, "a", slow_s=0.3)
        b = procs(address, token, "b")
        trainer.join(rack="r-train", host="t")
        a.join(rack="r-roll", host="a")
        b.join(rack="r-roll", host="b")
        pub = trainer.call("publish", model="policy", version=1, size_mb=16, seed=5)
        assert a.call("fetch", model="policy")["digest"] == pub["digest"]
        tag = b.start("fetch", model="policy")
        wait_until(lambda: sum(x["readers"] for x in a.call("served").values()) > 0, 30, "b reading from a")
        proc.kill()
        proc.wait()
        proc, _, _ = start_hub_process(str(tmp_path), port=port)
        a.kill()                            # b's source dies after the hub forgot b's fetch
        got = b.wait(tag)
        assert got["digest"] == pub["digest"]
        assert got["bytes_by_source"].get(trainer.wid, 0) > 0, got
    finally:
        proc.kill()
        proc.wait()


def test_registering_a_replica_the_hub_still_sees_as_a_fetch_completes_it():
    """A reader's fetch_done was lost (hub restart between its transfer and its report); it registers
    the replica it holds complete. The hub must take it as full, or the reader's next fetch into the
    same buffers fails: its release is refused as 'still being fetched'."""
    import torch

    from rlsync.hub import errors as E
    from rlsync.hub.model.manifest import build_manifest
    from rlsync.hub.model.shard import Shard
    from rlsync.hub.state import DONE, HubState
    s = HubState(HubConfig())
    t, r = s.join("t", Location(host="t"), {}), s.join("r", Location(host="r"), {})
    m = build_manifest({"w": torch.zeros(64)}, ManifestConfig())
    s.publish(t, "p", 1, Shard(), m)
    s.plan_fetch(r, "p", 1, Shard())
    with pytest.raises(E.NotAReplicaError, match="still being fetched"):
        s.release(r, "p", 1, Shard())
    s.register_replica(r, "p", 1, Shard(), "live", m)
    assert not s.fetches
    assert s.release(r, "p", 1, Shard()) == DONE


def test_a_release_in_flight_when_the_hub_dies_is_sent_again_at_once(tmp_path, procs, wait_until):
    """The trainer's release of `latest` waits for a relay (no answer yet) when the hub goes. Its copy is
    the only full one, and a re-join skips replicas being released (their release re-registers them
    itself). The release must notice at once that its request died with the hub and send it again: if it
    waited out its 5 s try, a fetch on the restarted hub outlived the re-registration grace and was
    told 'lost' while the trainer held the version (issue 18; seed 3 of the chaos sweep)."""
    port = free_port()
    kw = dict(port=port, journal=str(tmp_path / "journal.db"), token="t" * 48,
              config=HubConfig(reregister_grace_s=1.0))
    hub = start_embedded_hub(**kw)
    try:
        trainer = procs(hub.address, hub.token, "trainer", slow_s=0.3)  # 16 units: a relay takes ~5 s
        relay = procs(hub.address, hub.token, "relay")
        trainer.join(host="t")
        relay.join(host="a")
        pub = trainer.call("publish", model="policy", version=1, size_mb=16, seed=3)
        fetching = relay.start("fetch", model="policy")
        wait_until(lambda: reading_from(trainer), what="the relay reading from the trainer")
        releasing = trainer.start("release", model="policy", version=1)  # waits for the relay: pending
        wait_until(lambda: hub.server._waiting, what="the release pending on the hub")
        hub.stop()                                  # the pending release's answer never comes
        hub = start_embedded_hub(**kw)              # same address, same journal
        reader = HubClient(hub.address, hub.token, config=ClientConfig(hub_deadline_s=30.0))
        reader.join(Location(host="r"))
        got = reader.fetch("policy", 1)             # only the trainer holds v1 in full until the relay ends
        assert got.version == 1 and got.bytes_by_source.get(trainer.wid, 0) > 0, got.bytes_by_source
        reader.leave()
        assert relay.wait(fetching)["digest"] == pub["digest"]
        trainer.wait(releasing)
        close_all([trainer, relay])  # while the hub still answers their leave
    finally:
        hub.stop()


def test_a_holder_expired_while_stalled_serves_the_fetch_that_waited_for_it(procs, wait_until):
    """The trainer stalls past the worker timeout (SIGSTOP: a process starved on a loaded machine) and
    the hub expires it with its replicas. A fetch of its version then waits (the re-registration grace)
    instead of hearing 'lost'; once the trainer runs again it re-joins, re-registers and serves it."""
    with start_embedded_hub(config=HubConfig(worker_timeout_s=1.0, reregister_grace_s=60.0)) as hub:
        trainer = procs(hub.address, hub.token, "trainer", heartbeat_s=0.2)
        reader = procs(hub.address, hub.token, "reader", heartbeat_s=0.2)
        trainer.join(host="t")
        reader.join(host="r")
        pub = trainer.call("publish", model="policy", version=1, size_mb=2, seed=1)
        os.kill(trainer.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: trainer.wid not in hub.server.state.workers, what="the hub expiring the trainer")
            tag = reader.start("fetch", model="policy", version=1)
            wait_until(lambda: hub.server._parked, what="the fetch waiting for a holder (not told 'lost')")
        finally:
            os.kill(trainer.proc.pid, signal.SIGCONT)
        got = reader.wait(tag)
        assert got["version"] == 1 and got["digest"] == pub["digest"]
        assert got["bytes_by_source"] == {trainer.wid: got["nbytes"]}
        close_all([trainer, reader])  # while the hub still answers their leave


def test_a_sole_source_that_stalls_past_the_io_timeout_is_offered_again_once_heard_from(procs, wait_until):
    """The only holder (the trainer) stalls mid-transfer past the reader's io timeout (SIGSTOP: a starved
    process). The reader reports it failed; no other replica exists, but the trainer is still joined:
    the re-plan waits until the trainer is heard from again and offers it again, never 'lost'."""
    with start_embedded_hub(config=HubConfig(worker_timeout_s=60.0)) as hub:
        trainer = procs(hub.address, hub.token, "trainer", slow_s=0.05, heartbeat_s=0.2)
        reader = procs(hub.address, hub.token, "reader", io_timeout_s=1.0)
        trainer.join(host="t")
        reader.join(host="r")
        pub = trainer.call("publish", model="policy", version=1, size_mb=8, seed=4)
        tag = reader.start("fetch", model="policy")
        wait_until(lambda: reading_from(trainer), what="the reader reading from the trainer")
        os.kill(trainer.proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: hub.server._parked, what="the re-plan waiting for the stalled trainer (not 'lost')")
        finally:
            os.kill(trainer.proc.pid, signal.SIGCONT)
        got = reader.wait(tag)
        assert got["digest"] == pub["digest"] and set(got["bytes_by_source"]) == {trainer.wid}
        close_all([trainer, reader])  # while the hub still answers their leave


def test_a_publish_committed_by_a_hub_that_died_before_answering_is_recognised(tmp_path, wait_until):
    """The hub journals the commit of v2 and dies before it answers. The publish is sent again to the
    restarted hub, which first says 'not joined' (the client re-joins), then 'v2 <= latest 2'. The
    client must recognise its own commit (it registers the identical manifest) instead of raising
    VersionError: the chaos sweep's trainer (seed 3) lost v54 that way and then failed every publish."""
    import threading

    import torch

    from rlsync.hub.server.loop import _DEFERRED
    kw = dict(port=free_port(), journal=str(tmp_path / "journal.db"), token="t" * 48)
    hub = start_embedded_hub(**kw)
    trainer = HubClient(hub.address, hub.token, config=ClientConfig(hub_deadline_s=30.0))
    trainer.join(Location(host="t"))
    trainer.session.stop_heartbeat()  # no heartbeat re-join racing the publish: its own call meets 'not joined'
    trainer.session.heartbeat_thread.join()
    trainer.publish("policy", 1, {"w": torch.full((256,), 1.0)})
    server, publish = hub.server, hub.server.op_publish

    def commit_then_die(*a, **k):  # the fault: the commit is journaled, the answer never sent
        publish(*a, **k)
        server._stop.set()
        return _DEFERRED

    server.op_publish = commit_then_die
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(committed=trainer.publish("policy", 2, {"w": torch.full((256,), 2.0)})))
    t.start()
    wait_until(lambda: not server._thread.is_alive(), what="the hub dying after the commit")
    hub = start_embedded_hub(**kw)
    try:
        t.join(60)
        assert out == {"committed": True}
        assert trainer.versions("policy")["held"] == [1, 2]  # v2 registered by its publisher (v1 by the re-join)
        trainer.release("policy", 2)                       # and its release works
    finally:
        trainer.leave()
        hub.stop()


def test_after_a_hub_restart_the_trainers_copy_is_still_kept_while_one_reader_holds_it(tmp_path, wait_until):
    """The restarted hub learns who holds what from re-registration. The trainer re-registers its live
    copy as the publisher's (origin), so min_full_copies still applies: with one reader holding v1, the
    trainer's release offload-seeds instead of letting go (before, the new hub took it for a reader's)."""
    import torch

    kw = dict(port=free_port(), journal=str(tmp_path / "journal.db"), token="t" * 48)
    hub = start_embedded_hub(**kw)
    trainer = HubClient(hub.address, hub.token, config=ClientConfig(hub_deadline_s=30.0))
    reader = HubClient(hub.address, hub.token, config=ClientConfig(hub_deadline_s=30.0))
    try:
        trainer.join(Location(host="t"))
        reader.join(Location(host="r"))
        trainer.publish("policy", 1, {"w": torch.full((256,), 1.0)})
        hub.stop()
        hub = start_embedded_hub(**kw)
        wait_until(lambda: trainer.session.joins > 0, what="the trainer's re-join")
        assert reader.fetch("policy", 1).version == 1      # one reader holds v1 in full
        trainer.release("policy", 1)
        assert any(rid.endswith(":seed") for rid in trainer.replicas.held)  # the origin's copy stays, in host memory
    finally:
        reader.leave()
        trainer.leave()
        hub.stop()


def reading_from(w) -> bool:
    """Some reader is being served by worker `w` right now."""
    return any(x["readers"] for x in w.call("served").values())


def unread_bytes_at(port: int) -> int:
    """Bytes waiting, unread, in the receive queues of the connections accepted on `port` (IPv4)."""
    total = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if int(cols[1].split(":")[1], 16) == port and cols[3] == "01":  # ESTABLISHED, local = the hub
                total += int(cols[4].split(":")[1], 16)
    return total


def test_a_first_heartbeat_lost_with_the_hub_is_sent_again_at_once(tmp_path):
    """A worker's first heartbeat is in the hub's socket, unread, when the hub is killed (a worker that
    joined one heartbeat period before the kill). The heartbeat channel is new, but the client's join
    was answered at that address: the lost heartbeat is a restart, sent again the moment a hub listens,
    and the restarted hub answers it (NotJoined: re-join now). Before the fix the channel took it for a
    wrong address and waited out its whole try: 1.8 s of failover on chaos seed 9 (issue 18)."""
    from concurrent.futures import ThreadPoolExecutor

    from rlsync.hub.errors import NotJoinedError

    port = free_port()
    proc, address, token = start_hub_process(str(tmp_path), port=port)
    client = HubClient(address, token, config=ClientConfig(heartbeat_s=3600.0))
    try:
        client.join(Location(host="w"))
        # The client's own heartbeat thread wakes when the hub is back and would re-join under our id
        # first (the heartbeat under test then succeeds): told to stop, it exits on that wake-up instead.
        client.session.stop_heartbeat()
        with ThreadPoolExecutor(1) as ex:
            for _ in range(3):
                channel = client.session._heartbeat_channel()  # as the heartbeat thread makes it: never used yet
                os.kill(proc.pid, signal.SIGSTOP)      # the hub receives nothing from here on
                beat = ex.submit(channel.call, "heartbeat", wid=client.worker_id, attempt_s=30.0)
                if wait_for(lambda: unread_bytes_at(port) > 0, 5.0, fail=False) is not None:
                    break  # the heartbeat sits in the stopped hub's socket
                # The stop caught the channel's ZeroMQ handshake half-way: the heartbeat is still queued
                # in the client, not with the hub. Let the hub answer it, and set the scene again.
                os.kill(proc.pid, signal.SIGCONT)
                beat.result(timeout=60)
                channel.close()
            else:
                pytest.fail("the heartbeat never reached the stopped hub's socket in 3 tries")
            proc.kill()
            proc.wait()
            proc, _, _ = start_hub_process(str(tmp_path), port=port)
            with pytest.raises(NotJoinedError):  # the restarted hub's answer, not a timed-out try
                beat.result(timeout=60)
        channel.close()
    finally:
        client.leave()
        proc.kill()
        proc.wait()
