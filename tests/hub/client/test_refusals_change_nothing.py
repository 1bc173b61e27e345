"""Issue 30: a refusal changes nothing. A refused `adopt` keeps the worker's valid replica (client and hub
agree), destination buffers that alias each other are refused before anything moves, and the client's
replica book equals the hub's after every error path (`book_agrees`, tests/hub/books.py)."""
import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.model.shard import Shard

from books import book_agrees  # tests/hub/books.py

pytestmark = pytest.mark.timeout(60)


def model(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g)}


def test_a_refused_adopt_keeps_the_valid_replica_it_already_held(hub, make_client):
    t, r, r2 = make_client(host="t"), make_client(host="r"), make_client(host="r2")
    live = model()
    t.publish("m", 1, live)
    held = r.fetch("m", 1).tensors
    t.release("m", 1)
    wrong = {n: x.clone() for n, x in held.items()}
    wrong["w"].view(torch.uint8)[0] ^= 1
    before = r.held()
    with pytest.raises(E.ManifestMismatchError):
        r.adopt("m", 1, wrong)
    assert r.held() == before
    book_agrees(hub, r)
    # r is still the only holder of latest: a reader routed there gets the right bytes
    got = r2.fetch("m", "latest")
    assert got.version == 1 and all(torch.equal(got.tensors[n], live[n]) for n in live)
    # the same bytes in other buffers: refused (release the held copy first), nothing changed
    with pytest.raises(E.BufferMismatchError):
        r.adopt("m", 1, {n: x.clone() for n, x in held.items()})
    assert r.held() == before
    book_agrees(hub, r)
    r.adopt("m", 1, held)  # the very buffers it holds v1 in: nothing to do
    assert r.held() == before
    book_agrees(hub, r)


def test_a_refused_adopt_of_buffers_overlapping_another_version_releases_nothing(hub, make_client):
    t, r = make_client(host="t"), make_client(host="r")
    t.publish("m", 1, model(1))
    buf = r.fetch("m", 1).tensors
    t.release("m", 1)
    t.publish("m", 2, model(2))
    # r claims its v1 buffers hold v2 (they do not): refused; v1 stays held and served
    with pytest.raises(E.ManifestMismatchError):
        r.adopt("m", 2, buf)
    assert [(x.model, x.version) for x in r.held_ids()] == [("m", 1)]
    book_agrees(hub, r)


def test_fetch_into_buffers_that_alias_each_other_is_refused_before_anything_moves(hub, make_client):
    t, r = make_client(host="t"), make_client(host="r")
    t.publish("m", 1, {"a": torch.arange(64, dtype=torch.float32), "b": torch.arange(64, 128, dtype=torch.float32)})
    store = torch.zeros(96)
    into = {"a": store[:64], "b": store[32:]}  # views of one storage, overlapping by 32 elements
    with pytest.raises(E.BufferMismatchError, match="overlap"):
        r.fetch("m", 1, into=into)
    assert r.held() == [] and torch.count_nonzero(store) == 0
    book_agrees(hub, r)
    with pytest.raises(E.BufferMismatchError, match="overlap"):
        r.fetch_delta("m", 1, into={"a": store[:64], "b": store[:64]})
    book_agrees(hub, r)
    ok = torch.zeros(128)
    got = r.fetch("m", 1, into={"a": ok[:64], "b": ok[64:]})  # adjacent views: fine
    assert torch.equal(got.tensors["b"], torch.arange(64, 128, dtype=torch.float32))
    book_agrees(hub, r)


def test_fetch_into_buffers_of_a_fetch_still_in_progress_is_refused(hub, make_client):
    """`into` that overlaps a replica this worker cannot release (a relay still receiving) is refused."""
    from rlsync.hub.model.replica_id import ReplicaId
    from rlsync.hub.dataplane.store import LocalReplica
    from rlsync.hub.model.manifest import ManifestConfig, build_manifest

    t, r = make_client(host="t"), make_client(host="r")
    live = model()
    t.publish("m", 1, live)
    buf = {n: torch.zeros_like(x) for n, x in live.items()}
    relay = LocalReplica(ReplicaId(r.worker_id, "m", 9, Shard().key).wire, build_manifest(buf, ManifestConfig()), buf,
                         full=False)
    r.store.add(relay)  # what a fetch in another thread registers while its bytes arrive
    try:
        with pytest.raises(E.BufferMismatchError, match="overlap"):
            r.fetch("m", 1, into=buf)
    finally:
        r.store.remove(relay.id)
    assert r.held() == []
