"""The hub with real processes on loopback: fan-out, relay chains, release and retention, TP groups."""
import pytest

from rlsync.hub import ClientConfig, HubClient, ManifestConfig
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.tools.demo import start_hub_process
from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.tools.procs import WorkerProcess, close_all
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state import HubConfig

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def procs():
    made = []

    def make(address, token, name, slow_s=0.0, transport=None, **location):
        cfg = ClientConfig(dataplane=DataPlaneConfig(serve_delay_s=slow_s), transport=transport,
                           manifest=ManifestConfig(chunk_bytes=1 << 20))
        w = WorkerProcess(address, token, cfg, name=name)
        made.append((w, location))
        return w

    yield make
    close_all([w for w, _ in made])


def join_all(workers_locs):
    for w, loc in workers_locs:
        w.join(**loc)


def test_one_publish_eight_readers_bit_exact_and_hub_moves_no_weights(tmp_path, procs):
    hub, address, token = start_hub_process(str(tmp_path))
    try:
        trainer = procs(address, token, "trainer")
        readers = [procs(address, token, f"r{i}") for i in range(8)]
        trainer.join(host="trainer")
        for i, r in enumerate(readers):
            r.join(host=f"node{i % 4}")  # pairs of readers share a host: some reads go over shm
        pub = trainer.call("publish", model="policy", version=1, size_mb=16, seed=1)
        tags = [r.start("fetch", model="policy") for r in readers]
        res = [r.wait(t) for r, t in zip(readers, tags)]
        assert all(x["version"] == 1 and x["digest"] == pub["digest"] for x in res)
        moved = sum(sum(x["bytes_by_source"].values()) for x in res)
        assert moved == 8 * res[0]["nbytes"]
        stats = HubClient(address, token).stats()
        hub_bytes = stats["rpc_bytes_in"] + stats["rpc_bytes_out"]
        # Only control messages went through the hub: far less than one copy of the model.
        assert hub_bytes < res[0]["nbytes"] / 20, hub_bytes
        served = {r.wid: r.call("served") for r in [trainer, *readers]}
        total_served = sum(v["bytes"] for s in served.values() for v in s.values())
        assert total_served == moved
    finally:
        hub.terminate()
        hub.wait(10)


def test_relay_chain_each_reader_served_by_its_upstream(procs, wait_until):
    cfg = HubConfig(planner=PlannerConfig(fanout_cap=1, max_sources=1))
    with start_embedded_hub(config=cfg) as hub:
        trainer = procs(hub.address, hub.token, "trainer", slow_s=0.05)
        readers = [procs(hub.address, hub.token, f"r{i}", transport="tcp-py") for i in range(3)]
        trainer.join(host="t")
        for i, r in enumerate(readers):
            r.join(host=f"n{i}")
        pub = trainer.call("publish", model="policy", version=1, size_mb=32, seed=2)
        tags = []
        for r in readers:  # each starts once its upstream has its plan, while it is still receiving
            tags.append(r.start("fetch", model="policy"))
            wait_until(lambda: r.call("served"), what=f"{r.name}'s plan")
        res = [r.wait(t) for r, t in zip(readers, tags)]
        upstream = [trainer.wid] + [r.wid for r in readers[:-1]]
        for x, up in zip(res, upstream):
            assert x["digest"] == pub["digest"]
            assert list(x["bytes_by_source"]) == [up], (x["bytes_by_source"], up)
        # units served per peer: the trainer served exactly one copy, each relay one copy
        nunits = {r.wid: sum(v["units"] for v in r.call("served").values()) for r in [trainer, *readers]}
        assert nunits[trainer.wid] == nunits[readers[0].wid] == nunits[readers[1].wid] > 0
        assert nunits[readers[2].wid] == 0


def test_release_with_three_reads_in_flight_then_overwrite(procs, wait_until):
    with start_embedded_hub() as hub:
        trainer = procs(hub.address, hub.token, "trainer", slow_s=0.02)
        readers = [procs(hub.address, hub.token, f"r{i}") for i in range(4)]
        trainer.join(host="t")
        for i, r in enumerate(readers):
            r.join(host=f"n{i}")
        pub = trainer.call("publish", model="policy", version=1, size_mb=24, seed=3)
        tags = [r.start("fetch", model="policy", version=1) for r in readers[:3]]
        # the three reads are in flight: each has its plan, and the trainer is serving
        wait_until(lambda: all(r.call("served") for r in readers[:3])
                   and any(x["readers"] for x in trainer.call("served").values()), what="reads in flight")
        rel = trainer.call("release", model="policy", version=1)
        changed = trainer.call("overwrite", value=123.0)  # the writer reuses its buffers at once
        assert changed != pub["digest"]
        res = [r.wait(t) for r, t in zip(readers[:3], tags)]
        assert all(x["digest"] == pub["digest"] for x in res)  # none saw a changed byte
        # The release waited for the reads of the trainer's buffers to drain (readers planned on another
        # reader's relay read nothing of the trainer's, and may finish after it).
        assert rel["finished"] >= max(x["finished"] for x in res if trainer.wid in x["bytes_by_source"]) - 0.05
        late = readers[3].call("fetch", model="policy", version=1)
        assert late["digest"] == pub["digest"]
        assert trainer.wid not in late["bytes_by_source"]
        assert set(late["bytes_by_source"]) <= {r.wid for r in readers[:3]}


def test_sole_replica_release_mid_fetch_and_offload_seed(procs, wait_until):
    with start_embedded_hub() as hub:
        trainer = procs(hub.address, hub.token, "trainer", slow_s=0.02)
        readers = [procs(hub.address, hub.token, f"r{i}") for i in range(2)]
        trainer.join(host="t")
        for i, r in enumerate(readers):
            r.join(host=f"n{i}")
        pub = trainer.call("publish", model="policy", version=1, size_mb=16, seed=4)
        tag = readers[0].start("fetch", model="policy")
        wait_until(lambda: any(x["readers"] for x in trainer.call("served").values()), what="the read in flight")
        trainer.call("release", model="policy", version=1)   # sole replica; a reader is mid-fetch
        trainer.call("overwrite", value=-1.0)
        assert readers[0].wait(tag)["digest"] == pub["digest"]
        # v2: released with nobody reading → retention seeds a host copy; the live buffers change.
        pub2 = trainer.call("publish", model="policy", version=2, size_mb=16, seed=5, buf="v2")
        trainer.call("release", model="policy", version=2)
        trainer.call("overwrite", value=42.0, buf="v2")
        got = readers[1].call("fetch", model="policy", version=2)
        assert got["digest"] == pub2["digest"]
        assert list(got["bytes_by_source"]) == [trainer.wid]
        assert any(h.endswith(":seed") for h in trainer.call("held"))


def test_tp2_writer_commit_is_transactional_and_reader_group_pins(procs):
    with start_embedded_hub() as hub:
        w0, w1 = procs(hub.address, hub.token, "tp0"), procs(hub.address, hub.token, "tp1")
        g0, g1 = procs(hub.address, hub.token, "eng.tp0"), procs(hub.address, hub.token, "eng.tp1")
        for i, w in enumerate((w0, w1, g0, g1)):
            w.join(host=f"h{i}")
        probe = HubClient(hub.address, hub.token)
        a = w0.call("publish", model="policy", version=1, size_mb=2, seed=10, shard=(0, 0, 2, 1))
        assert not a["committed"]
        with pytest.raises(Exception, match="no committed version"):
            g0.call("fetch", model="policy", shard=(0, 0, 2, 1), group=("eng", 2))
        b = w1.call("publish", model="policy", version=1, size_mb=2, seed=11, shard=(1, 0, 2, 1))
        assert b["committed"] and probe.latest("policy") == 1
        r0 = g0.call("fetch", model="policy", shard=(0, 0, 2, 1), group=("eng", 2))
        # v2 commits between the two ranks' fetches: the group stays on v1.
        w0.call("publish", model="policy", version=2, size_mb=2, seed=12, shard=(0, 0, 2, 1), buf="b2")
        w1.call("publish", model="policy", version=2, size_mb=2, seed=13, shard=(1, 0, 2, 1), buf="b2")
        r1 = g1.call("fetch", model="policy", shard=(1, 0, 2, 1), group=("eng", 2))
        assert r0["version"] == r1["version"] == 1
        assert (r0["digest"], r1["digest"]) == (a["digest"], b["digest"])
        nxt = g0.call("fetch", model="policy", shard=(0, 0, 2, 1), group=("eng", 2), buf="n")
        assert nxt["version"] == 2
