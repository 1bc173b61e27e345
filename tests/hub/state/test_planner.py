from rlsync.hub.model.location import Location
from rlsync.hub.state.planner import Planner, PlannerConfig, Source


def src(rid, host="h", rack="r", dc="d", full=True, load=0):
    return Source(rid, rid, Location(dc=dc, rack=rack, host=host), full, load)


def test_topology_preference_host_rack_dc_crossdc():
    me = Location(dc="d", rack="r", host="h")
    p = Planner(PlannerConfig())
    cands = [src("x-dc", dc="other"), src("same-dc", rack="r2", host="z"), src("same-rack", host="z"),
             src("same-host")]
    assert list(p.choose_sources(me, cands, [1])) == ["same-host"]
    assert list(p.choose_sources(me, cands[:3], [1])) == ["same-rack"]
    assert list(p.choose_sources(me, cands[:2], [1])) == ["same-dc"]
    assert list(p.choose_sources(me, cands[:1], [1])) == ["x-dc"]


def test_fanout_cap_turns_a_crowd_into_a_relay_chain():
    me = Location(dc="d", rack="r", host="h9")
    p = Planner(PlannerConfig(fanout_cap=1, max_sources=1))
    trainer = src("trainer", host="t", load=1)       # already serving reader1
    relay1 = src("reader1", host="a", full=False, load=0)
    assert list(p.choose_sources(me, [trainer, relay1], [10] * 4)) == ["reader1"]


def test_relay_used_before_over_cap_full_replica_but_full_preferred_at_equal_load():
    me = Location(host="h")
    p = Planner(PlannerConfig(fanout_cap=4, max_sources=1))
    full, relay = src("full", host="a", load=0), src("relay", host="b", full=False, load=0)
    assert list(p.choose_sources(me, [relay, full], [1])) == ["full"]


def test_stripes_units_over_sources_for_large_shards():
    me = Location(host="h")
    p = Planner(PlannerConfig(max_sources=2, stripe_min_bytes=100))
    plan = p.choose_sources(me, [src("a", host="x"), src("b", host="y")], [50] * 6)
    assert plan == {"a": [0, 2, 4], "b": [1, 3, 5]}
    small = p.choose_sources(me, [src("a", host="x"), src("b", host="y")], [10] * 6)
    assert len(small) == 1


def test_cross_dc_crossing_is_limited_then_relays_in_dc():
    me = Location(dc="dc2", rack="r", host="h5")
    p = Planner(PlannerConfig(fanout_cap=1, cross_dc_streams=1))
    trainer = src("trainer", dc="dc1", host="t", load=0)
    relay_dc2 = src("dc2-relay", dc="dc2", host="h1", full=False, load=1)  # at cap, but in-DC
    # One transfer already crossing into dc2: use the in-DC relay even over its cap.
    assert list(p.choose_sources(me, [trainer, relay_dc2], [1], cross_dc_inflight=1)) == ["dc2-relay"]
    assert list(p.choose_sources(me, [trainer, relay_dc2], [1], cross_dc_inflight=0)) == ["trainer"]


def test_zero_units_still_names_a_source():
    plan = Planner(PlannerConfig()).choose_sources(Location(host="h"), [src("a")], [])
    assert plan == {"a": []}


def test_peers_before_the_publishers_copy_in_the_same_tier():
    me = Location(host="h")
    p = Planner(PlannerConfig(max_sources=1))
    trainer = Source("trainer", "t", Location(host="x"), True, 0, origin=True)
    peer = Source("peer", "p", Location(host="y"), True, 1)
    assert list(p.choose_sources(me, [trainer, peer], [1])) == ["peer"]
    near_trainer = Source("trainer", "t", Location(host="h"), True, 0, origin=True)
    assert list(p.choose_sources(me, [near_trainer, peer], [1])) == ["trainer"]  # topology first


def test_source_hosts_restricts_reads_to_those_hosts():
    me = Location(host="h")
    p = Planner(PlannerConfig(source_hosts=("t",), fanout_cap=1, max_sources=1))
    trainer = src("trainer", host="t", load=5)  # over cap, another host nearer: still the only choice
    near = src("near", host="h")
    assert list(p.choose_sources(me, [near, trainer], [1])) == ["trainer"]
    assert p.choose_sources(me, [near], [1]) == {}


def test_a_backup_seed_serves_only_when_no_full_live_replica_in_the_tier_can():
    """Rule 5: the trainer's offload seed (kept so that one kill cannot lose the version) is not striped
    in beside a rollout's full copy, so a joiner reads from the rollout; alone, or beside a relay, it serves."""
    me = Location(dc="d", rack="r", host="h")
    p = Planner(PlannerConfig(max_sources=2, stripe_min_bytes=100))
    seed = Source("t:seed", "t", Location(dc="d", rack="r", host="t"), True, 0, origin=True, backup=True)
    assert p.choose_sources(me, [seed, src("engine", host="e", load=3)], [50] * 4) == {"engine": [0, 1, 2, 3]}
    assert p.choose_sources(me, [seed], [50] * 2) == {"t:seed": [0, 1]}
    relay = src("relay", host="r", full=False)
    assert set(p.choose_sources(me, [seed, relay], [50] * 4)) == {"t:seed", "relay"}
    # topology still comes first: a backup on the reader's own host beats a live copy in another rack
    near = Source("n:seed", "n", Location(dc="d", rack="r", host="h"), True, 0, backup=True)
    assert list(p.choose_sources(me, [near, src("far", rack="r2", host="f")], [1])) == ["n:seed"]


def test_a_stripe_never_takes_a_sources_last_free_slot():
    """Rule 4: at fan-out cap 1 a read has one source, so two idle sources root two readers' chains
    instead of one reader's stripe (docs/scale.md: shuffled arrivals at scale then formed one long
    chain); under a wider cap a stripe still takes a source with slots to spare."""
    me = Location(host="h")
    one = Planner(PlannerConfig(fanout_cap=1, max_sources=2, stripe_min_bytes=100))
    assert one.choose_sources(me, [src("a", host="x"), src("b", host="y")], [50] * 4) == {"a": [0, 1, 2, 3]}
    two = Planner(PlannerConfig(fanout_cap=2, max_sources=2, stripe_min_bytes=100))
    assert two.choose_sources(me, [src("a", host="x"), src("b", host="y")], [50] * 4) == {"a": [0, 2], "b": [1, 3]}
    busy = [src("a", host="x"), src("b", host="y", load=1)]
    assert two.choose_sources(me, busy, [50] * 4) == {"a": [0, 1, 2, 3]}
