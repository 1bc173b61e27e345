"""hub/protocol/messages.py: a plan reply and an endpoint are typed once where they arrive; a malformed one
is a ProtocolError."""
import pytest

from rlsync.hub import errors as E
from rlsync.hub.protocol.messages import Endpoint, FetchPlan, Source

SRC = {"replica": "w1.1:m:3:tp0-pp0:live", "worker": "w1.1", "endpoint": {"tcp": "127.0.0.1:9"}, "units": [0, 2],
       "full": True, "ticket": b"t"}


def test_a_plan_reply_is_typed():
    p = FetchPlan.from_wire({"fetch_id": "f1.2", "version": 3, "held": False, "sources": [SRC],
                             "manifest_digest": "ab"})
    assert (p.fetch_id, p.version, p.held, p.manifest, p.manifest_digest) == ("f1.2", 3, False, None, "ab")
    assert p.sources == (Source("w1.1:m:3:tp0-pp0:live", "w1.1", Endpoint("127.0.0.1:9"), (0, 2), True, b"t"),)
    assert p.sources[0].endpoint.tcp == "127.0.0.1:9" and p.sources[0].endpoint.transports == ()
    held = FetchPlan.from_wire({"fetch_id": "", "version": 3, "held": True, "sources": []})
    assert held.held and held.sources == ()
    assert Source.list_from_wire({"sources": [SRC, SRC]})[1].units == (0, 2)


@pytest.mark.parametrize("reply", [None, [], {"fetch_id": "f", "held": False, "sources": []},
                                   {"fetch_id": "f", "version": "x", "sources": []},
                                   {"fetch_id": "f", "version": 1, "sources": None},
                                   {"fetch_id": "f", "version": 1, "sources": [{"worker": "w"}]},
                                   {"fetch_id": "f", "version": 1, "sources": [dict(SRC, units=["a"])]}])
def test_a_malformed_plan_is_a_protocol_error(reply):
    with pytest.raises(E.ProtocolError):
        FetchPlan.from_wire(reply)


def test_an_endpoint_round_trips_and_keeps_what_a_transport_added():
    wire = {"tcp": "10.0.0.7:41234", "pid": 812, "host": "node3", "boot_id": "b", "transports": ["tcp", "rdma"],
            "reader_key": b"k" * 32, "rdma": {"link_layer": "InfiniBand"}}
    e = Endpoint.from_wire(wire)
    assert (e.tcp, e.pid, e.host, e.boot_id, e.transports) == ("10.0.0.7:41234", 812, "node3", "b", ("tcp", "rdma"))
    assert e.info("rdma") == {"link_layer": "InfiniBand"} and e.info("cuda") == {}
    assert e.to_wire() == wire and Endpoint.from_wire(e.to_wire()) == e
    assert e.same_host(Endpoint("x:1", host="node3", boot_id="b"))
    assert not e.same_host(Endpoint("x:1", host="node3", boot_id="c"))
    assert not Endpoint("x:1", host="h").same_host(Endpoint("y:1", host="h"))  # no boot id: never the same host


@pytest.mark.parametrize("wire", [None, [], {}, {"tcp": 5}, {"tcp": "nohostport"}, {"tcp": "h:1", "pid": "12"},
                                  {"tcp": "h:1", "host": 3}, {"tcp": "h:1", "transports": "tcp"},
                                  {"tcp": "h:1", "transports": [1]}, {"tcp": "h:1", "reader_key": "k"}])
def test_a_malformed_endpoint_is_a_protocol_error(wire):
    with pytest.raises(E.ProtocolError, match="endpoint"):
        Endpoint.from_wire(wire)
    with pytest.raises(E.ProtocolError):
        FetchPlan.from_wire({"fetch_id": "f", "version": 1, "sources": [dict(SRC, endpoint=wire)]})
