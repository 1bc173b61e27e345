"""Per-version annotations: small opaque values on a committed version, journaled (a restarted hub has
them), written once, dropped with the version; every refusal typed and changing nothing."""
import pytest
import torch

from rlsync.hub import HubClient, Location, errors as E
from rlsync.hub.server.journal import Journal
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state.retention import KEEP_OLD

PROBE = {"tokens": [1, 5, 9], "logprobs": [-1.25, -0.5, -3.0], "dtype": "float32"}


def _joined(hub):
    c = HubClient(hub.address, hub.token)
    c.join(Location(dc="dc0", rack="r0", host="h0"), "trainer")
    return c


def test_annotate_round_trip_and_write_once(hub, make_client):
    c = make_client()
    c.publish("policy", 1, {"w": torch.ones(4)})
    assert c.annotations("policy", 1) == {}
    assert c.annotate("policy", 1, "probe", PROBE) is True
    assert c.annotate("policy", 1, "probe", PROBE) is False           # a retried call: no change
    with pytest.raises(E.VersionError, match="written once"):
        c.annotate("policy", 1, "probe", {**PROBE, "logprobs": [0.0]})
    assert make_client(host="h1").annotations("policy", 1) == {"probe": PROBE}


def test_refusals_are_typed_and_change_nothing(hub, make_client):
    c = make_client()
    c.publish("policy", 1, {"w": torch.ones(4)})
    c.annotate("policy", 1, "a", 1)
    sent = []
    c.observe_rpc(lambda op, args, result: sent.append(op))
    deep = 0
    for _ in range(20):
        deep = [deep]
    for value in ("x" * (17 << 10), b"bytes", {1: "int key"}, torch.ones(1), deep):
        with pytest.raises(E.InvalidArgumentError, match="annotate: value"):
            c.annotate("policy", 1, "b", value)
    assert sent == []                                                  # refused before anything was sent
    with pytest.raises(E.UnknownModelError):
        c.annotate("nope", 1, "a", 1)
    with pytest.raises(E.VersionNotFoundError, match="not a committed version"):
        c.annotate("policy", 2, "a", 1)
    with pytest.raises(E.VersionNotFoundError):
        c.annotations("policy", 2)
    assert c.annotations("policy", 1) == {"a": 1}


def test_annotations_survive_a_hub_restart_on_the_same_journal(tmp_path):
    journal = str(tmp_path / "j.db")
    with start_embedded_hub(journal=journal) as hub:
        c = _joined(hub)
        c.publish("policy", 3, {"w": torch.ones(4)})
        c.annotate("policy", 3, "probe", PROBE)
        c.leave()
    with start_embedded_hub(journal=journal, token=hub.token) as again:
        reader = HubClient(again.address, again.token)
        assert reader.annotations("policy", 3) == {"probe": PROBE}


def test_annotations_go_with_their_version_when_it_is_forgotten(tmp_path):
    journal = str(tmp_path / "j.db")
    with start_embedded_hub(journal=journal) as hub:
        c = _joined(hub)
        w = {"w": torch.ones(4)}
        c.publish("policy", 1, w)
        c.annotate("policy", 1, "probe", PROBE)
        for v in range(2, KEEP_OLD + 4):          # v1 falls out of retention, then out of KEEP_OLD
            c.publish("policy", v, w)
            c.release("policy", v - 1)
        with pytest.raises(E.VersionNotFoundError):
            c.annotations("policy", 1)
        c.annotate("policy", KEEP_OLD + 3, "probe", PROBE)
        c.leave()
    left = Journal(journal).load_annotations()
    assert [(m, v, k) for m, v, k, _ in left] == [("policy", KEEP_OLD + 3, "probe")]
