"""`HubClient.publish_async`: the checksum pass and the hub round trip off the caller's path, with the
same guarantees as `publish` — the version is visible only once every unit is checksummed and
registered, bad input is refused at the call, a failed publish is raised (by `result()` and by the
`release` that waits for it) and leaves nothing held, and `leave` lets a publish in flight land."""
import pytest
import torch

from rlsync.hub import Shard, errors as E
from rlsync.hub.model.manifest import ManifestConfig, build_manifest


def _tensors(seed: int, n: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(64 + 17 * i, 33, generator=g) for i in range(n)}


def test_sharded_async_publish_commits_when_both_land_and_reads_bit_exact(make_client):
    a, b, reader = make_client(name="rank0"), make_client(name="rank1"), make_client(name="reader")
    ta, tb = _tensors(1), _tensors(2)
    fa = a.publish_async("m", 1, ta, shard=Shard(tp=0, tp_size=2))
    assert fa.result(30) is False  # one shard of two: not committed yet
    assert reader.latest("m") is None
    fb = b.publish_async("m", 1, tb, shard=Shard(tp=1, tp_size=2))
    assert fb.result(30) is True
    assert reader.latest("m") == 1
    for shard, want in ((Shard(tp=0, tp_size=2), ta), (Shard(tp=1, tp_size=2), tb)):
        got = reader.fetch("m", 1, into={n: torch.empty_like(t) for n, t in want.items()}, shard=shard)
        assert all(torch.equal(got.tensors[n], want[n]) for n in want)
        reader.release("m", 1, shard=shard)


def test_release_right_after_publish_async_waits_for_it(make_client):
    w, other = make_client(name="trainer"), make_client(name="reader")
    t = _tensors(3)
    w.publish_async("m", 1, t)
    w.release("m", 1)  # lands first, then released: the buffers are the caller's again
    assert [h for h in w.held_ids() if h.slot == "live"] == []  # (retention keeps a host copy: a seed)
    assert 1 in other.versions("m")["committed"]
    w.publish_async("m", 2, t)  # the same buffers as the next version, as a trainer does
    w.release("m", 2)
    assert other.latest("m") == 2


def test_bad_input_is_refused_at_the_call_and_changes_nothing(make_client):
    w = make_client()
    with pytest.raises(E.HubError):
        w.publish_async("m", 1, {"w": "not a tensor"})
    with pytest.raises(E.HubError):
        w.publish_async("m", -1, _tensors(4))
    with pytest.raises(E.HubError):
        w.publish_async("m", 1, {"w": torch.zeros(8, 8).t()})  # not contiguous
    assert w.publisher.pending == {} and w.held() == []
    with pytest.raises(E.UnknownModelError):
        w.latest("m")  # the hub never heard of it
    t = _tensors(4)
    w.publish_async("m", 1, t)
    with pytest.raises(E.VersionError):
        w.publish_async("m", 1, t)  # the same replica twice, while the first is in flight or landed
    w.release("m", 1)


def test_a_failed_publish_is_raised_by_result_and_release_and_holds_nothing(make_client):
    first, second = make_client(name="a"), make_client(name="b")
    first.publish("m", 1, _tensors(5))
    fut = second.publish_async("m", 1, _tensors(6))  # v1 is committed with other bytes: the hub refuses
    with pytest.raises(E.HubError) as err:
        fut.result(30)
    with pytest.raises(type(err.value)):
        second.release("m", 1)
    assert second.held() == [] and list(second.store.all()) == []
    got = second.fetch("m", 1, into={n: torch.empty_like(t) for n, t in _tensors(5).items()})
    assert all(torch.equal(got.tensors[n], _tensors(5)[n]) for n in got.tensors)  # v1 untouched
    second.release("m", 1)


def test_leave_lets_a_publish_in_flight_land(make_client, hub):
    w, other = make_client(name="leaver"), make_client(name="reader")
    big = {"w": torch.randn(1 << 20)}  # 4 MiB: the checksum pass is still running when leave is called
    w.publish_async("m", 7, big)
    w.leave()  # the publish lands (committed), then the worker goes (without notice: its replica with it)
    assert 7 in other.versions("m")["committed"]
    assert w.publisher.pending == {} and w.publisher.pool is None


def test_native_checksums_match_the_reference_hash():
    """build_manifest hashes with the native engine when it is built; the digests are xxhash's."""
    import xxhash

    t = {"a": torch.randn(300, 7), "tiny": torch.arange(5, dtype=torch.int64), "empty": torch.empty(0),
         "b": torch.randn(1000).to(torch.bfloat16)}
    cfg = ManifestConfig(chunk_bytes=1024, pack_below=128, pack_bytes=512)
    m = build_manifest(t, cfg)
    views = {n: x.reshape(-1).view(torch.uint8).numpy().tobytes() for n, x in t.items()}
    for u in m.units:
        h = xxhash.xxh3_64()
        for ti, off, ln in u.segments:
            h.update(views[m.tensors[ti].name][off:off + ln])
        assert h.intdigest() == u.checksum
    assert m.verify(t) == []
    t["a"][3, 3] += 1.0
    assert build_manifest(t, cfg) != m  # the cached unit plan is reused; the checksums are not
