"""Retention and release decisions as pure logic (hub/state/retention.py), then one hand-off through HubState.

Milliseconds: no sockets, no threads.
"""
import pytest
import torch

from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import ManifestConfig, build_manifest
from rlsync.hub.state.retention import (KEEP_OLD, Action, ReleaseDecision, ReleaseView, RetentionConfig, RetentionPolicy,
                                  SeedWorker, choose_seed_worker, decide_release, drop_seed, forget_below,
                                  forgettable, is_retained)
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import DONE, PENDING, SEED, HubConfig, HubState

CFG, PREFER_SEED = RetentionConfig(), RetentionConfig(prefer_seed=True)


@pytest.mark.parametrize("cfg, view, want", [
    # not the last copy, or not retained: it goes (after its readers drain)
    (CFG, ReleaseView(retained=False, other_full=0, relays=0), ReleaseDecision(Action.RELEASE)),
    (CFG, ReleaseView(retained=True, other_full=1, relays=0), ReleaseDecision(Action.RELEASE)),
    (CFG, ReleaseView(retained=False, other_full=0, relays=0, inflight=2), ReleaseDecision(Action.WAIT)),
    # the last full copy of a retained version: wait for a relay, else seed; a seed slot cannot go
    (CFG, ReleaseView(retained=True, other_full=0, relays=1), ReleaseDecision(Action.WAIT)),
    (PREFER_SEED, ReleaseView(retained=True, other_full=0, relays=1), ReleaseDecision(Action.SEED)),
    (CFG, ReleaseView(retained=True, other_full=0, relays=0), ReleaseDecision(Action.SEED)),
    (CFG, ReleaseView(retained=True, other_full=0, relays=0, seed_slot=True), ReleaseDecision(Action.REFUSE)),
    # leaving with notice: a seed worker takes it; asked once; a dead target is replaced and the new one asked
    (CFG, ReleaseView(retained=True, other_full=0, relays=0, leaving=True, seed_candidate="s1"),
     ReleaseDecision(Action.HANDOFF, "s1", ask=True)),
    (CFG, ReleaseView(retained=True, other_full=0, relays=0, leaving=True, handoff_target="s1", seed_candidate="s2"),
     ReleaseDecision(Action.HANDOFF, "s1", ask=False)),
    (CFG, ReleaseView(retained=True, other_full=0, relays=0, leaving=True), ReleaseDecision(Action.SEED)),
    # leaving, but a relay will complete: no hand-off needed
    (CFG, ReleaseView(retained=True, other_full=0, relays=1, leaving=True, seed_candidate="s1"),
     ReleaseDecision(Action.WAIT)),
    # the origin's copy (the publisher's) needs min_full_copies (default 2) other full copies, or its own seed
    (CFG, ReleaseView(retained=True, other_full=1, relays=0, origin=True), ReleaseDecision(Action.SEED)),
    (CFG, ReleaseView(retained=True, other_full=1, relays=1, origin=True), ReleaseDecision(Action.WAIT)),
    (PREFER_SEED, ReleaseView(retained=True, other_full=1, relays=1, origin=True), ReleaseDecision(Action.SEED)),
    (CFG, ReleaseView(retained=True, other_full=2, relays=0, origin=True), ReleaseDecision(Action.RELEASE)),
    (CFG, ReleaseView(retained=True, other_full=1, relays=0, origin=True, own_seed=True),
     ReleaseDecision(Action.RELEASE)),
    (CFG, ReleaseView(retained=False, other_full=0, relays=0, origin=True), ReleaseDecision(Action.RELEASE)),
    (RetentionConfig(min_full_copies=1), ReleaseView(retained=True, other_full=1, relays=0, origin=True),
     ReleaseDecision(Action.RELEASE)),
    (RetentionConfig(min_full_copies=3), ReleaseView(retained=True, other_full=2, relays=0, origin=True),
     ReleaseDecision(Action.SEED)),
    # a leaving origin cannot stay: one other full copy (its relay or seed worker) suffices
    (CFG, ReleaseView(retained=True, other_full=1, relays=0, origin=True, leaving=True, handoff_target="s1"),
     ReleaseDecision(Action.RELEASE)),
])
def test_decide_release(cfg, view, want):
    assert decide_release(cfg, view) == want


def test_retained_drop_and_forget():
    assert is_retained(5, [3, 4, 5], retain_last=1)
    assert not is_retained(4, [3, 4, 5], retain_last=1)
    assert is_retained(4, [3, 4, 5], retain_last=2)
    assert is_retained(3, [3, 4, 5], 1, pinned=[3]) and is_retained(3, [3, 4, 5], 1, fetching=iter([3]))
    assert drop_seed(retained=False, inflight=0, releasing=False)
    assert not drop_seed(retained=True, inflight=0, releasing=False)
    assert not drop_seed(retained=False, inflight=1, releasing=False)
    assert not drop_seed(retained=False, inflight=0, releasing=True)
    below = forget_below(latest=100, retain_last=2)
    assert below == 100 - 2 - KEEP_OLD
    assert forgettable([1, 2, 3, below, 99], below, used={2}) == [1, 3]


def test_choose_seed_worker_nearest_then_least_asked():
    here = Location(dc="dc0", rack="r0", host="h0")
    near = SeedWorker("s-near", Location(dc="dc0", rack="r0", host="h1"), tasks=3)
    near_idle = SeedWorker("s-idle", Location(dc="dc0", rack="r0", host="h2"), tasks=0)
    far = SeedWorker("s-far", Location(dc="dc1"), tasks=0)
    assert choose_seed_worker(here, [far, near, near_idle], holders=[]) == "s-idle"
    assert choose_seed_worker(here, [far, near, near_idle], holders=["s-idle"]) == "s-near"
    assert choose_seed_worker(here, [far], holders=["s-far"]) == ""


def test_handoff_to_a_seed_worker_that_dies_asks_another():
    """HubState applies the decision: the first seed worker is asked; it dies; the next is asked."""
    m = build_manifest({"w": torch.ones(8)}, ManifestConfig())
    s = HubState(HubConfig())
    t = s.join("t", Location(host="t"), {"tcp": "x"})
    s1 = s.join("s1", Location(host="s1"), {"tcp": "y"}, role="seed")
    assert s.publish(t, "p", 1, Shard(), m)
    assert s.release(t, "p", 1, Shard(), handoff=True) is PENDING
    assert s.tasks_for(s1) == [["p", 1, "tp0-pp0", [1, 1]]]
    s.remove_worker(s1)
    s2 = s.join("s2", Location(host="s2"), {"tcp": "z"}, role="seed")
    assert s.poll_releases() == {}                  # still pending: the last copy waits for its taker
    assert s.tasks_for(s2) == [["p", 1, "tp0-pp0", [1, 1]]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_min_full_copies_validated(bad):
    with pytest.raises(ValueError, match="min_full_copies"):
        RetentionPolicy(RetentionConfig(min_full_copies=bad))


def test_origin_keeps_its_copy_while_one_reader_holds_the_version():
    """Issue 18's loss: the trainer let go of v once ONE reader held it, then that reader was kill -9'd.
    Now the release asks the trainer to seed a host copy first; the reader's death loses nothing."""
    m = build_manifest({"w": torch.ones(8)}, ManifestConfig())
    s = HubState(HubConfig())
    t = s.join("t", Location(host="t"), {"tcp": "x"})
    r = s.join("r", Location(host="r"), {"tcp": "y"})
    assert s.publish(t, "p", 1, Shard(), m)
    s.fetch_done(r, s.plan_fetch(r, "p", 1, Shard()).fetch_id, True)
    assert s.release(t, "p", 1, Shard()) is SEED         # one other full copy is not enough
    s.register_replica(t, "p", 1, Shard(), "seed", m)     # the client's offload seed (host copy)
    assert s.release(t, "p", 1, Shard()) is DONE          # its own seed keeps the origin's copy
    s.remove_worker(r)                                    # the reader is kill -9'd (expired)
    plan = s.plan_fetch(s.join("r2", Location(host="r2"), {"tcp": "z"}), "p", 1, Shard())
    assert {rec.worker for rec, _, _ in plan.sources} == {t}


def test_the_origins_seed_is_a_backup_read_last_and_dropped_once_two_readers_hold_the_version():
    """The seed the origin keeps for min_full_copies is not a source beside a reader's full copy (a joiner
    reads from the reader, as before the rule), and goes as soon as a second reader holds the version."""
    m = build_manifest({"w": torch.ones(8)}, ManifestConfig())
    s = HubState(HubConfig())
    t, r, r2 = (s.join(n, Location(host=n), {"tcp": n}) for n in ("t", "r", "r2"))
    assert s.publish(t, "p", 1, Shard(), m)
    s.fetch_done(r, s.plan_fetch(r, "p", 1, Shard()).fetch_id, True)
    assert s.release(t, "p", 1, Shard()) is SEED
    seed = s.register_replica(t, "p", 1, Shard(), "seed", m)
    assert s.release(t, "p", 1, Shard()) is DONE
    plan = s.plan_fetch(r2, "p", 1, Shard())
    assert {rec.worker for rec, _, _ in plan.sources} == {r}  # the reader's copy, not the trainer's seed
    assert s.drops_for(t) == []                               # one other full copy: the seed stays
    s.fetch_done(r2, plan.fetch_id, True)
    assert s.drops_for(t) == [seed]                           # two: it was kept only until now


def test_a_seed_workers_copy_of_the_latest_is_not_dropped_for_being_redundant():
    """Redundancy drops only offload seeds: a following seed worker's copy of the latest stays (the hub
    would ask it for the version again at once)."""
    m = build_manifest({"w": torch.ones(8)}, ManifestConfig())
    s = HubState(HubConfig())
    t, a, b = (s.join(n, Location(host=n), {"tcp": n}) for n in ("t", "a", "b"))
    sw = s.join("s", Location(host="s"), {"tcp": "s"}, role="seed", follow=True)
    assert s.publish(t, "p", 1, Shard(), m)
    for w in (a, b, sw):
        s.fetch_done(w, s.plan_fetch(w, "p", 1, Shard()).fetch_id, True)
    assert s.drops_for(sw) == []


def test_the_publishers_copy_re_registered_after_a_restart_is_still_the_origins():
    """A restarted hub learns replica locations from re-registration. The trainer's live copy says it is
    the origin's (`origin=True`), so min_full_copies still guards it; a reader's copy cannot claim it."""
    m = build_manifest({"w": torch.ones(8)}, ManifestConfig())
    s = HubState(HubConfig())                                 # the new hub, after the journal
    s.restore_committed("p", 1, (1, 1), {Shard().key: m})
    t, r = (s.join(n, Location(host=n), {"tcp": n}) for n in ("t", "r"))
    s.register_replica(t, "p", 1, Shard(), "live", m, origin=True)
    s.register_replica(r, "p", 1, Shard(), "live", m)
    assert s.release(t, "p", 1, Shard()) is SEED              # one other full copy is not enough
    assert s.release(r, "p", 1, Shard()) is DONE              # a reader's copy goes with one other
