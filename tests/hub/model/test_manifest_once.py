"""A fetch plan carries the manifest only when the reader does not have it (issue 19).

A reader names the manifests it has (`fetch`'s `have_manifests`, digests from earlier plans); the
hub names the plan's manifest by digest and leaves it out when the reader has it. A fetch without
the argument (an older client) gets the manifest as before; a bad argument is a typed error.
"""
import msgpack
import pytest
import torch
import zmq

from rlsync.hub import errors as E


def raw_fetch(hub, wid, **extra):
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(hub.address)
    try:
        args = {"wid": wid, "model": "p", "version": 1, "shard": [0, 0, 1, 1], **extra}
        d.send_multipart([b"", msgpack.packb({"id": 1, "op": "fetch", "token": hub.token, "args": args})])
        assert d.poll(10_000), "no reply to fetch"
        return msgpack.unpackb(d.recv_multipart()[-1], strict_map_key=False)
    finally:
        d.close()


def test_a_second_plan_of_a_manifest_the_reader_has_carries_none_and_the_fetch_is_bit_exact(hub, make_client):
    trainer, reader = make_client(host="a", name="trainer"), make_client(host="b", name="reader")
    g = torch.Generator().manual_seed(7)
    w = {f"l{i}": torch.randn(4096, generator=g) for i in range(6)}
    trainer.publish("p", 1, w)
    plans = []
    reader.observe_rpc(lambda op, args, out: plans.append((args, out)) if op == "fetch" else None)

    first = reader.fetch("p", 1)
    assert "manifest" in plans[0][1] and plans[0][0]["have_manifests"] == []
    digest = plans[0][1]["manifest_digest"]
    reader.release("p", 1)
    second = reader.fetch("p", 1)
    args, plan = plans[-1]
    assert args["have_manifests"] == [digest] and plan["manifest_digest"] == digest
    assert "manifest" not in plan  # no manifest bytes in the reply
    assert second.manifest is first.manifest
    for k in w:
        assert torch.equal(second.tensors[k], w[k])  # still bit-exact (units verified against it)


def test_a_fetch_without_the_argument_gets_the_manifest_and_a_bad_one_is_typed(hub, make_client):
    trainer, reader = make_client(host="a", name="trainer"), make_client(host="b", name="reader")
    trainer.publish("p", 1, {"w": torch.arange(64, dtype=torch.float32)})
    old = raw_fetch(hub, reader.worker_id)
    assert old["ok"] and "manifest" in old["result"] and "manifest_digest" not in old["result"]
    digest = raw_fetch(hub, reader.worker_id, have_manifests=[])["result"]["manifest_digest"]
    has = raw_fetch(hub, reader.worker_id, have_manifests=["0" * 32, digest])
    assert has["ok"] and "manifest" not in has["result"] and has["result"]["manifest_digest"] == digest
    saved = len(msgpack.packb(old["result"])) - len(msgpack.packb(has["result"]))
    assert saved >= len(msgpack.packb(old["result"]["manifest"])) - 64  # its bytes (less the digest) stay home
    fetches = sorted(hub.server.state.fetches)
    for bad in ("x", [1], ["XYZ"], [""], ["a" * 65], ["ab"] * 65, {"a": 1}):
        reply = raw_fetch(hub, reader.worker_id, have_manifests=bad)
        assert not reply["ok"] and reply["error"][0] == "invalid_argument", (bad, reply)
        assert "have_manifests" in reply["error"][1]
    assert sorted(hub.server.state.fetches) == fetches  # nothing planned by a bad request


def test_the_client_cache_is_bounded_and_refuses_a_manifest_it_was_not_sent():
    from rlsync.hub.client.manifests import ManifestCache
    from rlsync.hub.model.manifest import ManifestConfig, build_manifest
    from rlsync.hub.model.shard import Shard
    from rlsync.hub.protocol.messages import FetchPlan

    m = build_manifest({"w": torch.arange(8, dtype=torch.float32)}, ManifestConfig())
    cache = ManifestCache(size=2)
    for i in range(3):
        cache.take(FetchPlan("f", 1, False, (), m.to_wire(), f"{i:02x}"), {}, "p", Shard())
    assert sorted(cache.have("p", Shard())) == ["01", "02"] and cache.have("q", Shard()) == {}
    with pytest.raises(E.ProtocolError, match="did not say it has"):
        cache.take(FetchPlan("f", 1, False, (), None, "00"), cache.have("p", Shard()), "p", Shard())
