"""The hub's state machine, without sockets: publish/commit, fetch plans, release and retention."""
import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import ManifestConfig, build_manifest
from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.state.retention import RetentionConfig
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import DONE, PENDING, SEED, HubConfig, HubState

M = build_manifest({"w": torch.ones(8), "b": torch.zeros(2)}, ManifestConfig())
MANY = build_manifest({"w": torch.ones(8)}, ManifestConfig(chunk_bytes=8, pack_below=0))
M2 = build_manifest({"w": torch.full((8,), 2.0), "b": torch.zeros(2)}, ManifestConfig())


def state(**kw):
    s = HubState(HubConfig(**kw))
    ids = {n: s.join(n, Location(host=n), {"tcp": "x"}) for n in ("t", "r1", "r2", "r3")}
    return s, ids


def snapshot(s):
    return (sorted(s.replicas), sorted(s.fetches), {n: list(m.committed) for n, m in s.models.items()},
            {n: dict(m.pins) for n, m in s.models.items()})


def test_publish_commits_and_versions_only_increase():
    s, w = state()
    assert s.publish(w["t"], "p", 1, Shard(), M)
    assert s.models["p"].latest == 1
    before = snapshot(s)
    with pytest.raises(E.VersionError):
        s.publish(w["t"], "p", 1, Shard(), M)
    with pytest.raises(E.VersionError):
        s.publish(w["r1"], "p", 0, Shard(), M)
    assert snapshot(s) == before


def test_tp2_version_invisible_until_both_shards_and_mismatch_refused():
    s, w = state()
    assert not s.publish(w["t"], "p", 3, Shard(tp=0, tp_size=2), M)
    with pytest.raises(E.UnknownModelError):
        pass_ = s.plan_fetch(w["r1"], "nope", "latest", Shard())
    with pytest.raises(E.VersionNotFoundError):
        s.plan_fetch(w["r1"], "p", "latest", Shard(tp=0, tp_size=2))
    other = build_manifest({"x": torch.ones(8)}, ManifestConfig())
    before = snapshot(s)
    with pytest.raises(E.ManifestMismatchError):
        s.publish(w["r1"], "p", 3, Shard(tp=1, tp_size=2), other)
    with pytest.raises(E.ShardError):
        s.publish(w["r1"], "p", 3, Shard(tp=1, tp_size=4), M)
    with pytest.raises(E.ManifestMismatchError):  # same shard, other bytes
        s.publish(w["r1"], "p", 3, Shard(tp=0, tp_size=2), M2)
    assert snapshot(s) == before
    assert s.publish(w["r1"], "p", 3, Shard(tp=1, tp_size=2), M2)
    assert s.models["p"].latest == 3


def test_reader_group_pins_one_version_across_ranks():
    s, w = state()
    for tp in (0, 1):
        s.publish(w["t"], "p", 1, Shard(tp=tp, tp_size=2), M)
    p0 = s.plan_fetch(w["r1"], "p", "latest", Shard(tp=0, tp_size=2), group=("eng", 2))
    for tp in (0, 1):
        s.publish(w["t"], "p", 2, Shard(tp=tp, tp_size=2), M)
    p1 = s.plan_fetch(w["r2"], "p", "latest", Shard(tp=1, tp_size=2), group=("eng", 2))
    assert p0.version == p1.version == 1
    s.fetch_done(w["r1"], p0.fetch_id, True)
    s.fetch_done(w["r2"], p1.fetch_id, True)
    assert s.plan_fetch(w["r3"], "p", "latest", Shard(tp=0, tp_size=2), group=("eng", 2)).version == 2


def test_release_waits_for_inflight_reads_then_routes_elsewhere():
    s, w = state(planner=PlannerConfig(stripe_min_bytes=1, max_sources=2))  # r2 reads trainer + r1
    s.publish(w["t"], "p", 1, Shard(), MANY)
    plans = [s.plan_fetch(w[r], "p", 1, Shard()) for r in ("r1", "r2")]
    assert s.release(w["t"], "p", 1, Shard()) is PENDING   # sole full replica; relays in flight
    tid = f"{w['t']}:p:1:tp0-pp0:live"
    assert s.replicas[tid].releasing
    p3 = s.plan_fetch(w["r3"], "p", 1, Shard())            # new reads avoid the releasing replica
    assert all(src[0].id != tid for src in p3.sources)
    s.fetch_done(w["r1"], plans[0].fetch_id, True)
    assert s.poll_releases() == {}                          # r2 still reading from it
    s.fetch_done(w["r2"], plans[1].fetch_id, True)
    assert s.poll_releases() == {tid: DONE}
    assert tid not in s.replicas


def test_sole_replica_of_latest_must_seed_and_old_versions_just_go():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    assert s.release(w["t"], "p", 1, Shard()) is SEED
    assert not s.replicas[f"{w['t']}:p:1:tp0-pp0:live"].releasing
    s.register_replica(w["t"], "p", 1, Shard(), "seed", M)
    assert s.release(w["t"], "p", 1, Shard()) is DONE
    s.publish(w["t"], "p", 2, Shard(), M2)
    assert s.drops_for(w["t"]) == [f"{w['t']}:p:1:tp0-pp0:seed"]  # v1 no longer retained
    with pytest.raises(E.VersionNotRetainedError):
        s.plan_fetch(w["r1"], "p", 1, Shard())


def test_relay_dying_turns_a_wait_into_a_seed():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    plan = s.plan_fetch(w["r1"], "p", 1, Shard())
    assert s.release(w["t"], "p", 1, Shard()) is PENDING
    s.fetch_done(w["r1"], plan.fetch_id, False)
    assert s.poll_releases() == {f"{w['t']}:p:1:tp0-pp0:live": SEED}


def test_prefer_seed_policy_and_lost_version():
    s, w = state(retention=RetentionConfig(prefer_seed=True))
    s.publish(w["t"], "p", 1, Shard(), M)
    s.plan_fetch(w["r1"], "p", 1, Shard())
    assert s.release(w["t"], "p", 1, Shard()) is SEED
    s.remove_worker(w["t"])
    s.remove_worker(w["r1"])
    with pytest.raises(E.VersionLostError):
        s.plan_fetch(w["r2"], "p", 1, Shard())


def test_bad_into_spec_changes_nothing():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    before = snapshot(s)
    for spec in ([["w", "float32", [8]]], [["w", "float32", [9]], ["b", "float32", [2]]],
                 [["w", "float64", [8]], ["b", "float32", [2]]]):
        with pytest.raises(E.BufferMismatchError):
            s.plan_fetch(w["r1"], "p", 1, Shard(), into_spec=spec)
    assert snapshot(s) == before


def test_fanout_cap_chains_readers_through_relays():
    s, w = state(planner=PlannerConfig(fanout_cap=1, max_sources=1))
    s.publish(w["t"], "p", 1, Shard(), M)
    a = s.plan_fetch(w["r1"], "p", 1, Shard())
    b = s.plan_fetch(w["r2"], "p", 1, Shard())
    c = s.plan_fetch(w["r3"], "p", 1, Shard())
    assert [p.sources[0][1].id for p in (a, b, c)] == [w["t"], w["r1"], w["r2"]]


def test_releasing_replica_still_serves_when_the_relay_it_waited_for_died():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    a = s.plan_fetch(w["r1"], "p", 1, Shard())
    assert s.release(w["t"], "p", 1, Shard()) is PENDING      # waits for relay r1
    b = s.plan_fetch(w["r2"], "p", 1, Shard())               # r2 relays from r1
    assert b.sources[0][1].id == w["r1"]
    s.fetch_done(w["r1"], a.fetch_id, False)                 # r1 dies: r2 must not find "lost"
    again = s.replan(w["r2"], b.fetch_id, [b.sources[0][0].id], [0])
    assert again.sources[0][1].id == w["t"]
    s.fetch_done(w["r2"], b.fetch_id, True)
    # r2 is the one other full copy: the trainer's (origin's) copy needs min_full_copies=2, so it seeds
    assert s.poll_releases() == {f"{w['t']}:p:1:tp0-pp0:live": SEED}


def test_source_hosts_pins_every_read_to_the_trainer_and_refuses_cleanly_without_it():
    s, w = state(planner=PlannerConfig(fanout_cap=1, max_sources=1, source_hosts=("t",)))
    s.publish(w["t"], "p", 1, Shard(), M)
    plans = [s.plan_fetch(w[r], "p", 1, Shard()) for r in ("r1", "r2", "r3")]
    assert [p.sources[0][1].id for p in plans] == [w["t"]] * 3  # never a relay, whatever the cap
    s.fetch_done(w["r1"], plans[0].fetch_id, True)
    s.fetch_done(w["r2"], plans[1].fetch_id, True)
    s.fetch_done(w["r3"], plans[2].fetch_id, True)
    s2, w2 = state(planner=PlannerConfig(source_hosts=("nobody",)))
    s2.publish(w2["t"], "p", 1, Shard(), M)
    before = snapshot(s2)
    with pytest.raises(E.VersionLostError, match="source_hosts"):
        s2.plan_fetch(w2["r1"], "p", 1, Shard())
    assert snapshot(s2) == before


def test_old_versions_are_forgotten_unless_still_held_so_the_hub_does_not_grow():
    """The soak run (docs/benchmarks.md) saw the hub grow by every version's manifest, for ever."""
    from rlsync.hub.state import KEEP_OLD

    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    s.plan_fetch(w["r1"], "p", 1, Shard())  # r1 is fetching v1: it must stay
    n = 1 + KEEP_OLD + 40
    for v in range(2, n + 1):
        s.publish(w["t"], "p", v, Shard(), M)
        s.release(w["t"], "p", v - 1, Shard())
    m = s.models["p"]
    assert len(m.versions) <= 1 + 1 + KEEP_OLD + 1 and m.latest == n
    assert 1 in m.versions and m.committed[0] == 1  # still being fetched: kept
    assert 2 not in m.versions
    with pytest.raises(E.VersionNotRetainedError, match="no longer retained"):
        s.plan_fetch(w["r2"], "p", 2, Shard())
    with pytest.raises(E.VersionError):
        s.publish(w["t"], "p", 2, Shard(), M)  # a forgotten number is never reused


def test_the_hub_keeps_no_forgotten_versions_manifest_alive_beyond_a_small_cache():
    """The soak run (docs/benchmarks.md) saw every hub lifetime grow ~1.3 MiB over its first ~280 versions:
    caches keyed by manifest (unit sizes per plan) held up to 256 manifests of versions the hub had forgotten."""
    import gc

    from rlsync.hub.model.manifest import Manifest

    def manifests():  # every Manifest alive in this process (other tests' too: counted once, before)
        gc.collect()
        return sum(isinstance(o, Manifest) for o in gc.get_objects())

    s, w = state()
    most, before = 0, manifests()
    for v in range(1, 301):
        m = build_manifest({"w": torch.full((8,), float(v)), "b": torch.zeros(2)}, ManifestConfig())
        s.publish(w["t"], "p", v, Shard(), m)
        for r in ("r1", "r2"):
            s.fetch_done(w[r], s.plan_fetch(w[r], "p", v, Shard()).fetch_id, True)
            if v > 1:
                s.release(w[r], "p", v - 1, Shard())
        if v > 1:
            s.release(w["t"], "p", v - 1, Shard())
        del m
        if v % 50 == 0:  # the most alive at these points (a bounded cache may clear itself when full)
            most = max(most, manifests() - before - len(s.models["p"].versions))
    assert most <= 16, f"{most} manifests of versions the hub no longer keeps were still alive"


def test_a_partial_read_is_never_a_relay_and_cannot_end_as_a_replica():
    s, w = state()
    s.publish(w["t"], "p", 1, Shard(), M)
    part = s.plan_fetch(w["r1"], "p", 1, Shard(), relay=False)
    assert [rec.worker for rec, _, _ in part.sources] == [w["t"]] and len(s.replicas) == 1  # nothing advertised
    later = s.plan_fetch(w["r2"], "p", 1, Shard())  # while it is open: planned on the trainer only
    assert [rec.worker for rec, _, _ in later.sources] == [w["t"]]
    before = snapshot(s)
    with pytest.raises(E.ProtocolError, match="partial read"):
        s.fetch_done(w["r1"], part.fetch_id, True)
    assert snapshot(s) == before  # refused: the fetch still open, no replica made
    s.fetch_done(w["r1"], part.fetch_id, False)
    assert part.fetch_id not in s.fetches and len(s.replicas) == 2  # the trainer's and r2's relay
    # a worker with its own full fetch open reads part of the same shard: its relay is left alone
    full = s.plan_fetch(w["r3"], "p", 1, Shard())
    part3 = s.plan_fetch(w["r3"], "p", 1, Shard(), relay=False)
    s.fetch_done(w["r3"], part3.fetch_id, False)
    assert full.fetch_id in s.fetches and any(r.worker == w["r3"] for r in s.replicas.values())
