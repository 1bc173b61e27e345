"""ReplicaId: the one encoding of a replica's identity (milliseconds)."""
import pytest

from rlsync.hub import ReplicaId
from rlsync.hub import errors as E


def test_round_trip_and_seed_slot():
    rid = ReplicaId("w2.7", "policy", 12, "tp1-pp0")
    assert rid.wire == str(rid) == "w2.7:policy:12:tp1-pp0:live"
    assert ReplicaId.parse(rid.wire) == rid
    assert rid.as_seed() == ReplicaId("w2.7", "policy", 12, "tp1-pp0", "seed")
    assert rid.as_seed().as_live() == rid
    assert len({rid, ReplicaId.parse(rid.wire)}) == 1  # hashable, equal by value


@pytest.mark.parametrize("bad", ["", "w1:policy:1:tp0-pp0", "w1:policy:x:tp0-pp0:live",
                                 "w1:policy:1:tp0-pp0:cold", "w1::1:tp0-pp0:live", "w1:a:b:1:tp0-pp0:live", 7])
def test_malformed_is_a_protocol_error(bad):
    with pytest.raises(E.ProtocolError, match="malformed replica id"):
        ReplicaId.parse(bad)
