"""hub/protocol/messages.py: a plan reply is typed once where it arrives; a malformed one is a ProtocolError."""
import pytest

from rlsync.hub import errors as E
from rlsync.hub.protocol.messages import FetchPlan, Source

SRC = {"replica": "w1.1:m:3:tp0-pp0:live", "worker": "w1.1", "endpoint": {"tcp": "127.0.0.1:9"}, "units": [0, 2],
       "full": True, "ticket": b"t"}


def test_a_plan_reply_is_typed():
    p = FetchPlan.from_wire({"fetch_id": "f1.2", "version": 3, "held": False, "sources": [SRC],
                             "manifest_digest": "ab"})
    assert (p.fetch_id, p.version, p.held, p.manifest, p.manifest_digest) == ("f1.2", 3, False, None, "ab")
    assert p.sources == (Source("w1.1:m:3:tp0-pp0:live", "w1.1", {"tcp": "127.0.0.1:9"}, (0, 2), True, b"t"),)
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
