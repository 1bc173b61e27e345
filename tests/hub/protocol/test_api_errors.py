"""Every public entry point refuses bad input with a documented typed error (docs/integration.md).

Each of these raised an untyped error, hung, or created files on ea01902: `version=2**70` gave
OverflowError, a bad address zmq.ZMQError, a missing token file was created, a first contact with
an address where no hub runs blocked 60 s, and wrong-typed arguments in valid-token frames raised
inside hub handlers.
"""
import os
import socket
import time

import msgpack
import pytest
import torch
import zmq

from rlsync.hub import ClientConfig, HubClient, Location, Shard
from rlsync.hub import errors as E
from rlsync.hub.protocol.args import SPECS, Bad

W = {"w": torch.arange(64, dtype=torch.float32)}


@pytest.fixture
def joined(hub, make_client):
    c = make_client(host="t", name="trainer")
    c.publish("policy", 1, W)
    return c


def test_out_of_range_versions_and_bad_coordinates_are_typed(hub, joined):
    before = joined.stats()
    for bad in (2**70, -1, 1.5, True, None, "7"):
        with pytest.raises(E.VersionError, match="version must be an int"):
            joined.publish("policy", bad, W)
        with pytest.raises(E.VersionError, match="version must be an int"):
            joined.release("policy", bad)
        if bad is not None:
            with pytest.raises(E.VersionError, match="version must be an int"):
                joined.fetch("policy", bad)
    for model in ("", "a:b", 7, None, "x" * 300):
        with pytest.raises(E.InvalidArgumentError, match="model"):
            joined.fetch(model)
        with pytest.raises(E.InvalidArgumentError, match="model"):
            joined.latest(model)
        with pytest.raises(E.InvalidArgumentError, match="model"):
            joined.wait_latest(model, 1, timeout_s=0)
    for at_least, timeout_s, named in ((2**70, 0, "at_least"), (-1, 0, "at_least"), (1, -1, "timeout_s"),
                                       (1, float("inf"), "timeout_s"), (1, "1", "timeout_s")):
        with pytest.raises(E.InvalidArgumentError, match=f"wait_latest: {named}"):
            joined.wait_latest("policy", at_least, timeout_s)
    with pytest.raises(E.ShardError, match="shard"):
        joined.fetch("policy", 1, shard=[0, 0, 1, 1])
    with pytest.raises(E.InvalidArgumentError, match="group"):
        joined.fetch("policy", group=("g", 0))
    with pytest.raises(E.InvalidArgumentError, match="location"):
        HubClient(hub.address, hub.token).join(location={"dc": "x"})
    assert joined.held() == [f"{joined.worker_id}:policy:1:tp0-pp0:live"]
    after = joined.stats()
    assert {k: after[k] for k in ("workers", "replicas", "fetches", "models")} == \
        {k: before[k] for k in ("workers", "replicas", "fetches", "models")}


def test_bad_addresses_are_typed():
    for address in ("nonsense", "tcp://", "tcp://127.0.0.1:notaport", 42):
        with pytest.raises(E.InvalidArgumentError, match="address"):
            HubClient(address, "tok")


def test_missing_token_file_is_an_error_and_creates_nothing(tmp_path):
    path = tmp_path / "nope" / "token"
    with pytest.raises(E.AuthError, match="does not exist"):
        HubClient("tcp://127.0.0.1:1", token_file=str(path))
    path = tmp_path / "token"
    with pytest.raises(E.AuthError, match="does not exist"):
        HubClient("tcp://127.0.0.1:1", token_file=str(path))
    assert not path.exists() and os.listdir(tmp_path) == []
    path.write_text("")
    with pytest.raises(E.AuthError, match="empty"):
        HubClient("tcp://127.0.0.1:1", token_file=str(path))


def test_first_contact_with_no_hub_fails_within_one_rpc_timeout():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # a port nobody listens on (bound, never listening)
    port = s.getsockname()[1]
    c = HubClient(f"tcp://127.0.0.1:{port}", "tok", config=ClientConfig(rpc_timeout_s=1.0, hub_deadline_s=60.0))
    t0 = time.monotonic()
    with pytest.raises(E.HubUnavailableError, match="no hub answered"):
        c.join(Location(host="x"))
    # The failover deadline (60 s) is for a hub that answered once; this one never did.
    assert time.monotonic() - t0 < 1.0 + 5.0
    assert c.session.data is None
    s.close()


# ------------------------------------------------------------------ valid token, wrong-typed arguments
WRONG = [None, -1, 2**63, 1.5, True, "", "x" * 300, b"\x00", [], [1, 2], {}, {"a": 1}]


def valid(op, arg, value) -> bool:
    try:
        SPECS[op][arg][0](value)
        return True
    except Bad:
        return False


def call_raw(hub, op, args):
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(hub.address)
    try:
        d.send_multipart([b"", msgpack.packb({"id": 1, "op": op, "token": hub.token, "args": args})])
        assert d.poll(10_000), f"no reply to {op}"
        return msgpack.unpackb(d.recv_multipart()[-1], strict_map_key=False)
    finally:
        d.close()


@pytest.mark.parametrize("op", sorted(op for op in SPECS if SPECS[op]))
def test_every_op_refuses_each_wrong_typed_argument(hub, joined, op, caplog):
    good = {"wid": joined.worker_id, "model": "policy", "version": 1, "shard": [0, 0, 1, 1], "slot": "live",
            "name": "n", "location": {"dc": "d"}, "endpoint": {"tcp": "127.0.0.1:1", "reader_key": b"k" * 32},
            "fetch_id": "f", "failed": [], "units": [0], "ok": True, "manifest": {"t": [], "u": []},
            "worker_id": "w", "role": "worker", "follow": False, "group": ["g", 1], "into_spec": [],
            "handoff": False, "base": 0, "origin": False, "have_manifests": [], "explain": False,
            "manifest_digest": "0" * 32, "done": [], "release_deltas": [], "gone": [], "at_least": 1, "timeout_s": 0,
            "transform": "bf16", "params": {}, "key": "k", "value": 1, "relay": True, "home": "h"}
    state = hub.server.state
    before = (sorted(state.workers), sorted(state.replicas), sorted(state.fetches))
    for arg in SPECS[op]:
        for bad in WRONG:
            if valid(op, arg, bad):
                continue  # e.g. None for an optional argument, {} for a location (all defaults)
            args = {k: good[k] for k in SPECS[op]}
            args[arg] = bad
            reply = call_raw(hub, op, args)
            assert not reply["ok"], (op, arg, bad, reply)
            assert reply["error"][0] in E._BY_CODE and reply["error"][0] != "hub_error", (op, arg, bad, reply)
    assert (sorted(state.workers), sorted(state.replicas), sorted(state.fetches)) == before
    assert "internal error" not in caplog.text and "Traceback" not in caplog.text


def test_every_error_class_is_in_the_documented_list():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "integration.md").read_text()
    table = doc[doc.index("## Errors"):]
    for code, cls in E._BY_CODE.items():
        assert f"| `{cls.__name__}` (`{code}`" in table, f"{cls.__name__} missing from docs/integration.md#errors"


def test_join_twice_is_already_joined_and_changes_nothing(hub, joined):
    wid, before = joined.worker_id, joined.stats()
    with pytest.raises(E.AlreadyJoinedError, match="leave"):
        joined.join(Location(host="elsewhere"))
    assert joined.worker_id == wid and joined.stats()["workers"] == before["workers"]
    assert joined.fetch("policy", 1).version == 1  # still joined as before: calls work
    assert joined.held() == [f"{wid}:policy:1:tp0-pp0:live"]


def test_releasing_the_last_seed_copy_of_a_retained_version_is_typed_and_changes_nothing():
    """A seed copy that is the only full replica of a retained version cannot be released (it would
    lose the version): LastReplicaError, over the wire as `last_replica`; the replica stays."""
    from rlsync.hub.model.manifest import ManifestConfig, build_manifest
    from rlsync.hub.state import DONE, SEED, HubConfig, HubState

    s = HubState(HubConfig())
    t = s.join("t", Location(host="t"), {})
    m = build_manifest(W, ManifestConfig())
    s.publish(t, "p", 1, Shard(), m)
    assert s.release(t, "p", 1, Shard()) == SEED          # the last replica: copy it first
    s.register_replica(t, "p", 1, Shard(), "seed", m)
    assert s.release(t, "p", 1, Shard()) == DONE          # the live buffers go; the seed copy keeps v1
    before = sorted(s.replicas)
    with pytest.raises(E.LastReplicaError, match="last replica"):
        s.release(t, "p", 1, Shard(), slot="seed")
    assert sorted(s.replicas) == before == [f"{t}:p:1:tp0-pp0:seed"]
    assert isinstance(E.error_from_code("last_replica", "x"), E.LastReplicaError)
    assert isinstance(E.error_from_code("already_joined", "x"), E.AlreadyJoinedError)
