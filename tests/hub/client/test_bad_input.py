"""Bad input: each gets a typed error, changes no hub state, and leaves the hub serving."""
import socket
import struct
import time

import msgpack
import pytest
import torch
import zmq

from rlsync.hub import HubClient, Location, Shard
from rlsync.hub import errors as E
from rlsync.hub.dataplane.wire import MAGIC, REQ, UNIT
from rlsync.hub.protocol.tickets import ReaderKey, Ticket, TicketSigner

W = {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(3)}


def snapshot(hub):
    s = hub.server.state
    return (sorted(s.replicas), {k: (r.full, r.releasing) for k, r in s.replicas.items()}, sorted(s.fetches),
            {n: list(m.committed) for n, m in s.models.items()},
            {n: sorted(m.versions) for n, m in s.models.items()})


@pytest.fixture
def published(hub, make_client):
    trainer = make_client(host="t", name="trainer")
    trainer.publish("policy", 1, W)
    reader = make_client(host="r", name="reader")
    return trainer, reader


def test_unknown_model_and_unknown_versions(hub, published):
    trainer, reader = published
    before = snapshot(hub)
    with pytest.raises(E.UnknownModelError, match="unknown model 'nope'"):
        reader.fetch("nope")
    with pytest.raises(E.VersionNotFoundError, match="never committed"):
        reader.fetch("policy", 7)
    with pytest.raises(E.VersionError):
        reader.fetch("policy", "newest")
    assert snapshot(hub) == before


def test_fetch_of_version_no_longer_retained(hub, published):
    trainer, reader = published
    trainer.publish("policy", 2, {k: v.clone() for k, v in W.items()})
    trainer.release("policy", 1)   # not retained any more: released without seeding
    before = snapshot(hub)
    with pytest.raises(E.VersionNotRetainedError, match="no longer retained"):
        reader.fetch("policy", 1)
    assert snapshot(hub) == before


def test_publish_at_or_below_latest_and_mismatched_shards(hub, published):
    trainer, reader = published
    before = snapshot(hub)
    with pytest.raises(E.VersionError, match="<= latest committed 1"):
        reader.publish("policy", 1, W)
    with pytest.raises(E.VersionError):
        reader.publish("policy", 0, W)
    assert snapshot(hub) == before
    trainer.publish("policy", 5, W, shard=Shard(tp=0, tp_size=2))
    before = snapshot(hub)
    with pytest.raises(E.ManifestMismatchError, match="disagree"):
        reader.publish("policy", 5, {"other": torch.zeros(4)}, shard=Shard(tp=1, tp_size=2))
    with pytest.raises(E.ShardError):
        reader.publish("policy", 5, W, shard=Shard(tp=1, tp_size=4))
    with pytest.raises(E.ShardError):
        Shard(tp=2, tp_size=2)
    assert snapshot(hub) == before
    assert reader.held() == []


def test_into_with_wrong_names_shapes_dtypes(hub, published):
    _, reader = published
    before = snapshot(hub)
    bad = [{"w": torch.empty(4096)},                                        # missing b
           {"w": torch.empty(4096), "b": torch.empty(3), "x": torch.empty(1)},  # extra
           {"w": torch.empty(4095), "b": torch.empty(3)},                   # shape
           {"w": torch.empty(4096, dtype=torch.float16), "b": torch.empty(3)},  # dtype
           {"w": torch.empty(8192)[::2], "b": torch.empty(3)}]             # non-contiguous
    for into in bad:
        with pytest.raises(E.BufferMismatchError):
            reader.fetch("policy", into=into)
    assert snapshot(hub) == before
    good = {"w": torch.empty(4096), "b": torch.empty(3)}
    assert reader.fetch("policy", into=good).version == 1 and torch.equal(good["w"], W["w"])


def test_wrong_or_missing_token(hub, published):
    before = snapshot(hub)
    bad = HubClient(hub.address, "not-the-token")
    with pytest.raises(E.AuthError):
        bad.join(Location(host="x"))
    with pytest.raises(E.AuthError):
        HubClient(hub.address, "")
    assert snapshot(hub) == before and len(hub.server.state.workers) == 2


def raw_request(endpoint: str, body: dict | bytes, kind=1, magic=MAGIC):
    host, port = endpoint.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    data = body if isinstance(body, bytes) else msgpack.packb(body)
    s.sendall(REQ.pack(magic, 1, kind, 0, len(data)) + data)
    return s


def read_error(s):
    head = s.recv(UNIT.size, socket.MSG_WAITALL)
    unit, status, n = UNIT.unpack(head)
    code, text = msgpack.unpackb(s.recv(n, socket.MSG_WAITALL))
    return status, code, text


def test_data_plane_refuses_missing_and_forged_tickets(hub, published):
    trainer, _ = published
    endpoint = trainer.session.endpoint.tcp
    rid = f"{trainer.worker_id}:policy:1:tp0-pp0:live"
    for ticket in (None, b"x" * 80):
        s = raw_request(endpoint, {"ticket": ticket, "replica": rid, "units": [0]})
        status, code, text = read_error(s)
        assert status == 1 and code == "ticket", text
    # A well-formed ticket signed by a key that is not the hub's (more in test_security.py).
    key = ReaderKey()
    forged = TicketSigner().sign(Ticket("f1", "w9", key.public_bytes, trainer.worker_id, rid, time.time() + 60))
    status, code, text = read_error(raw_request(endpoint, key.sign_request(forged, rid, [0])))
    assert code == "ticket" and "forged" in text
    # A genuine ticket for another replica is refused too.
    genuine = hub.server.signer.sign(Ticket("f1", "w9", key.public_bytes, trainer.worker_id, rid + "x",
                                            time.time() + 60))
    status, code, text = read_error(raw_request(endpoint, key.sign_request(genuine, rid, [0])))
    assert code == "ticket"
    assert trainer.store.get(rid).units_served == 0


def test_malformed_oversized_and_truncated_frames_do_not_hurt_servers(hub, published, wait_until):
    trainer, reader = published
    endpoint = trainer.session.endpoint.tcp
    # data plane: bad magic, oversized body, garbage body, truncated header then close
    for sock in (raw_request(endpoint, {"a": 1}, magic=b"XXXX"),
                 raw_request(endpoint, b"{", kind=1)):
        assert read_error(sock)[1] == "protocol"
    host, port = endpoint.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.sendall(REQ.pack(MAGIC, 1, 1, 0, 1 << 30))  # claims a 1 GiB request
    assert read_error(s)[1] == "protocol"
    s = socket.create_connection((host, int(port)))
    s.sendall(b"RL")  # disconnects mid-header
    s.close()
    # control plane: garbage, a non-map, an oversized message, a request then disconnect
    ctx = zmq.Context.instance()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(hub.address)
    d.send_multipart([b"", b"\xc1\xc1garbage"])
    assert d.poll(5000)
    reply = msgpack.unpackb(d.recv_multipart()[-1])
    assert reply["ok"] is False and reply["error"][0] == "protocol"
    d.send_multipart([b"", msgpack.packb([1, 2, 3])])
    assert d.poll(5000) and msgpack.unpackb(d.recv_multipart()[-1])["error"][0] == "protocol"
    d.send_multipart([b"", b"x" * (65 << 20)])  # over MAXMSGSIZE: zmq drops this peer
    d.close()
    handled = hub.server.rpc_count
    d2 = ctx.socket(zmq.DEALER)
    d2.connect(hub.address)
    d2.send_multipart([b"", msgpack.packb({"id": 1, "op": "release", "token": hub.token,
                                           "args": {"wid": trainer.worker_id, "model": "policy",
                                                    "version": 1, "shard": [0, 0, 1, 1]}})])
    d2.close(linger=0)  # client disconnects mid-request
    # Everything still works, and the bytes are right (once the hub handled that last request).
    wait_until(lambda: hub.server.rpc_count > handled, what="the hub handling the abandoned request")
    got = reader.fetch("policy", 1)
    assert torch.equal(got.tensors["w"], W["w"])


def test_publish_and_fetch_before_join_are_refused(hub):
    c = HubClient(hub.address, hub.token)
    with pytest.raises(E.NotJoinedError):
        c.publish("policy", 1, W)
    with pytest.raises(E.NotJoinedError):
        c.fetch("policy")


def test_fetch_of_a_version_already_held_moves_nothing(hub, published):
    _, reader = published
    first = reader.fetch("policy")
    again = reader.fetch("policy")
    assert again.version == 1 and again.nbytes == 0 and again.tensors["w"].data_ptr() == first.tensors["w"].data_ptr()
    other = {"w": torch.empty(4096), "b": torch.empty(3)}
    copy = reader.fetch("policy", into=other)
    assert copy.nbytes == 0 and torch.equal(other["w"], W["w"])
