"""Buffers reused by a later fetch: the client and the hub must forget what they held before.

`fetch(v, into=A)` must never return another version's bytes, and the hub must never route a
reader to a replica whose buffers now hold something else: after a local-copy fetch (0 bytes
moved), after a fetch that failed midway, and after a hub restart (re-registration).
"""

import pytest
import torch

from rlsync.hub import ClientConfig, HubClient, Location, ManifestConfig
from rlsync.hub.client import fetch as client_mod  # the module whose fetch reads from sources
from rlsync.hub import errors as E
from rlsync.hub.server.loop import start_embedded_hub

from waiting import wait_for  # tests/waiting.py

pytestmark = pytest.mark.timeout(120)


def model(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((4096,), value), "b": torch.full((3,), value)}


def empty() -> dict[str, torch.Tensor]:
    return {"w": torch.empty(4096), "b": torch.empty(3)}


def holders(hub, version: int) -> set[str]:
    return {r.worker for r in list(hub.server.state.replicas.values()) if r.model == "policy" and r.version == version}


@pytest.fixture
def two_versions(hub, make_client):
    """A trainer publishes v2 (all 2.0) and v3 (all 3.0) from two buffers and keeps both."""
    trainer = make_client(host="t", name="trainer", config=ClientConfig(manifest=ManifestConfig(chunk_bytes=4096, pack_below=0)))
    trainer.publish("policy", 2, model(2.0))
    trainer.publish("policy", 3, model(3.0))
    reader = make_client(host="r", name="reader")
    return trainer, reader


def assert_holds(tensors: dict, value: float) -> None:
    for name, t in tensors.items():
        assert torch.equal(t, torch.full_like(t, value)), f"{name} does not hold {value}"


def test_local_copy_into_buffers_of_another_version_forgets_that_version(hub, two_versions):
    _, reader = two_versions
    a, b = empty(), empty()
    assert reader.fetch("policy", 2, into=a).nbytes > 0
    assert reader.fetch("policy", 3, into=b).nbytes > 0
    copy = reader.fetch("policy", 3, into=a)       # served by a local copy from b: 0 bytes moved
    assert copy.version == 3 and copy.nbytes == 0
    assert_holds(a, 3.0)
    # a no longer holds v2: neither the client nor the hub may say it does.
    assert reader.worker_id not in holders(hub, 2)
    assert not any(":policy:2:" in rid for rid in reader.held())
    again = reader.fetch("policy", 2, into=a)       # must move v2's bytes, not answer from a
    assert again.version == 2 and again.nbytes > 0
    assert_holds(a, 2.0)
    fresh = empty()
    assert_holds(reader.fetch("policy", 2, into=fresh).tensors, 2.0)


def test_other_readers_are_never_routed_to_reused_buffers(hub, two_versions, make_client):
    trainer, reader = two_versions
    a, b = empty(), empty()
    reader.fetch("policy", 2, into=a)
    reader.fetch("policy", 3, into=b)
    reader.fetch("policy", 3, into=a)
    trainer.release("policy", 2)                     # only the reader could still serve v2 now
    other = make_client(host="r", name="other")      # same host as the reader: it would be preferred
    with pytest.raises(E.VersionNotRetainedError):
        other.fetch("policy", 2)


def test_a_fetch_that_fails_midway_leaves_no_replica_in_its_buffers(hub, two_versions, monkeypatch):
    _, reader = two_versions
    a = empty()
    reader.fetch("policy", 2, into=a)
    real = client_mod.read_from_source

    def dies_after_one_unit(transport, endpoint, ticket, replica_id, units, dest, *args, **kw):
        if not any(dest.present):  # the first unit lands (overwriting part of `a`), then the source dies
            real(transport, endpoint, ticket, replica_id, units[:1], dest, *args, **kw)
        raise E.TransferError("injected: source died mid-transfer")

    monkeypatch.setattr(client_mod, "read_from_source", dies_after_one_unit)
    with pytest.raises(E.HubError):  # the only source keeps failing: the fetch gives up, typed
        reader.fetch("policy", 3, into=a)
    monkeypatch.undo()
    # The replica that lived in `a` (v2) was released before the first byte landed; v3 never completed.
    assert reader.worker_id not in holders(hub, 2) | holders(hub, 3)
    assert reader.held() == []
    assert_holds(reader.fetch("policy", 2, into=a).tensors, 2.0)
    assert_holds(reader.fetch("policy", 3, into=empty()).tensors, 3.0)


def test_restart_re_registers_only_what_the_buffers_still_hold(tmp_path):
    journal = str(tmp_path / "journal.db")
    hub = start_embedded_hub(journal=journal)
    port = int(hub.address.rsplit(":", 1)[1])
    trainer = HubClient(hub.address, hub.token)
    reader = HubClient(hub.address, hub.token)
    try:
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        trainer.publish("policy", 2, model(2.0))
        trainer.publish("policy", 3, model(3.0))
        a, b = empty(), empty()
        reader.fetch("policy", 2, into=a)
        reader.fetch("policy", 3, into=b)
        reader.fetch("policy", 3, into=a)
        hub.stop()
        hub = start_embedded_hub(port=port, token=hub.token, journal=journal)
        # Wait (bounded) until both workers re-registered with the restarted hub.
        state = hub.server.state
        wait_for(lambda: {trainer.worker_id, reader.worker_id} <= set(dict(state.workers))
                 and reader.worker_id in holders(hub, 3), 30, "both workers re-registered", fail=False, every_s=0.05)
        assert reader.worker_id in holders(hub, 3)
        assert reader.worker_id not in holders(hub, 2)
    finally:
        reader.leave()
        trainer.leave()
        hub.stop()


def test_an_aborted_relay_is_drained_before_its_buffers_are_reused(hub, make_client, caplog):
    """A fetch aborts while a downstream reader still reads its present units; the caller reuses
    `into` at once (as a retry does). The downstream reader must never see those bytes change
    (before the fix: 'failed its checksum' at the downstream reader, then a re-plan)."""
    import dataclasses
    import threading

    from rlsync.hub.dataplane.config import DataPlaneConfig
    chunked = ClientConfig(manifest=ManifestConfig(chunk_bytes=4096, pack_below=0))
    trainer = make_client(host="t", rack="r-t", name="trainer", config=chunked)
    trainer.publish("policy", 1, {"w": torch.arange(8192, dtype=torch.float32)})
    relay = make_client(host="r", rack="r-r", name="relay",
                        config=ClientConfig(dataplane=DataPlaneConfig(serve_delay_s=0.05)))
    down = make_client(host="r", rack="r-r", name="downstream")
    a = {"w": torch.empty(8192)}

    def fails_after_four_units(sources, dest, pull):
        wait_for(lambda: dest.readers > 0, 30, fail=False, every_s=0.01)  # the downstream reader is on us
        pull([dataclasses.replace(s, units=s.units[:4]) for s in sources])
        return [], [E.BufferMismatchError("injected: a fatal error after four units")]

    relay.set_pull_fault(fails_after_four_units)
    outcome = {}

    def relay_fetch_then_reuse():
        try:
            relay.fetch("policy", 1, into=a)
        except E.HubError as e:
            outcome["error"] = e
            a["w"].fill_(-1.0)  # reuse at once, as a retry into the same buffers would

    t = threading.Thread(target=relay_fetch_then_reuse)
    t.start()
    rid = f"{relay.worker_id}:policy:1:tp0-pp0:live"
    wait_for(lambda: relay.store.get(rid) is not None, 30, fail=False, every_s=0.01)
    with caplog.at_level("WARNING", logger="rlsync.hub.client"):
        got = down.fetch("policy", 1)   # planned on the relay (same host beats the trainer's)
    t.join(30)
    assert isinstance(outcome.get("error"), E.BufferMismatchError)
    assert torch.equal(got.tensors["w"], torch.arange(8192, dtype=torch.float32))
    assert not [r.getMessage() for r in caplog.records if "checksum" in r.getMessage()]
    assert got.bytes_by_source.get(relay.worker_id, 0) > 0          # it did read from the relay


def test_a_fetch_the_hub_plans_of_a_version_held_here_is_answered_from_the_held_copy(hub, make_client):
    """The hub lost its record of a replica this worker holds (a re-join raced the end of the fetch that
    got it, under chaos) and plans a transfer of that version into the same buffers. The client must not
    fetch over its own replica (before: the release of 'the old version in those buffers' was refused as
    'still being fetched', NotAReplicaError): it registers the replica again and answers from it."""
    trainer = make_client(host="t", name="trainer")
    reader = make_client(host="r", name="reader")
    trainer.publish("policy", 1, {"w": torch.full((1024,), 1.0)})
    got = reader.fetch("policy", 1)
    rid = reader.held()[0]
    state = hub.server.state
    del state.replicas[rid]                        # the fault: the hub forgets the reader's replica
    again = reader.fetch("policy", 1, into=got.tensors)
    assert again.version == 1 and again.nbytes == 0 and torch.equal(again.tensors["w"], torch.full((1024,), 1.0))
    assert state.replicas[rid].full and not state.fetches  # registered again, the plan closed
    assert reader.held() == [rid]
