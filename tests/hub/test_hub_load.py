"""The hub reports its own latency in `stats` (issue 19): plan time, RPC rate, heartbeat lag."""
import msgpack
import torch

from rlsync.hub.server_load import HubLoad, packed_map


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
