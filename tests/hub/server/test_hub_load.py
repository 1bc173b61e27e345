"""The hub reports its own latency in `stats` (issue 19): plan time, RPC rate, heartbeat lag."""
import msgpack
import torch

from rlsync.hub.server.load import HubLoad, packed_map


def test_stats_carry_plan_time_rpc_rate_and_heartbeat_lag(hub, make_client, wait_until):
    trainer, reader = make_client(host="a", name="trainer"), make_client(host="b", name="reader")
    w = {"w": torch.arange(64, dtype=torch.float32)}
    trainer.publish("p", 1, w)
    got = reader.fetch("p", 1)
    assert torch.equal(got.tensors["w"], w["w"]) and got.manifest is not None  # the plan's manifest arrived whole
    s = reader.stats()
    assert s["plans_timed"] == 1 and 0 < s["plan_ms"] == s["plan_ms_p99"] < 10_000
    # Both workers were heard from moments ago (joins, publish, fetch): far below the expiry timeout.
    assert 0 <= s["heartbeat_lag_ms"] < 1000 * hub.server.cfg.worker_timeout_s
    wait_until(lambda: reader.stats()["rpc_per_s"] > 0, what="a non-zero RPC rate after a tick")


def test_rpc_rate_is_counted_over_the_horizon():
    load = HubLoad(rate_horizon_s=10.0)
    for t, n in ((0.0, 0), (5.0, 500), (10.0, 1000), (20.0, 1000)):
        load.tick(n, now=t)
    snap = load.snapshot(1000, [19.0, 19.5], now=20.0)
    assert snap["rpc_per_s"] == 0.0  # nothing in the last 10 s
    assert snap["heartbeat_lag_ms"] == 1000.0 and snap["plans_timed"] == 0


def test_packed_map_equals_packing_the_whole_map():
    inner = {"manifest": {"t": [["w", "float32", [4], 16]], "u": [[16, 7, [[0, 0, 16]]]]}}
    items = {f"k{i}": i for i in range(20)}  # past 15 entries: the 16-bit map header
    for head in ({"id": 3, "ok": True}, items):
        raw = packed_map(head, {k: msgpack.packb(v) for k, v in inner.items()})
        assert msgpack.unpackb(raw, strict_map_key=False) == {**head, **inner}


def test_a_known_manifest_in_a_request_decodes_to_what_a_full_decode_gives():
    from rlsync.bench.hub_scale import big_manifest
    from rlsync.hub.server.known_manifests import KnownManifests
    from rlsync.hub.model.manifest import Manifest

    known, other = big_manifest(300, seed=1), big_manifest(300, seed=2)
    k = KnownManifests()
    k.add(known)

    def msg(op, manifest_wire, **extra):
        return msgpack.packb({"id": 7, "op": op, "token": "t", "args": {"wid": "w1", "manifest": manifest_wire, **extra}})

    hit = k.decode(msg("register", known.to_wire()))
    assert hit["args"]["manifest"] is known and k.hits == 1
    assert {**hit, "args": {**hit["args"], "manifest": known.to_wire()}} == msgpack.unpackb(msg("register", known.to_wire()))
    # Not a hit, decoded whole: an unknown manifest; another op; the known bytes inside a bin value.
    for data in (msg("register", other.to_wire()), msg("fetch", known.to_wire()),
                 msg("register", {"t": [], "u": []}, blob=msgpack.packb(known.to_wire()))):
        assert k.decode(data) == msgpack.unpackb(data, strict_map_key=False)
    assert k.hits == 1
    assert Manifest.from_wire(known.to_wire()) == known


def test_a_restarted_hub_recognizes_the_manifests_workers_re_register(tmp_path):
    from rlsync.bench.hub_scale import big_manifest
    from rlsync.hub import start_embedded_hub
    from rlsync.hub.protocol.rpc import RpcChannel

    m, journal = big_manifest(300), str(tmp_path / "j.db")
    where, ep = {"dc": "d", "rack": "r", "host": "h"}, {"tcp": "127.0.0.1:1", "reader_key": b"k" * 32}
    with start_embedded_hub(journal=journal) as hub:
        rpc = RpcChannel(hub.address, hub.token)
        wid = rpc.call("join", name="t", location=where, endpoint=ep)["wid"]
        rpc.call("publish", wid=wid, model="p", version=1, shard=[0, 0, 1, 1], manifest=m.to_wire())
        rpc.close()
    with start_embedded_hub(journal=journal, token=hub.token) as hub2:
        rpc = RpcChannel(hub2.address, hub2.token)
        rpc.call("join", name="t", location=where, endpoint=ep, worker_id=wid)
        rid = rpc.call("register", wid=wid, model="p", version=1, shard=[0, 0, 1, 1], slot="live", manifest=m.to_wire())
        rpc.close()
        assert hub2.server._known.hits == 1 and hub2.server.state.replicas[rid].full
        assert hub2.server.state.models["p"].versions[1].manifests["tp0-pp0"] == m
