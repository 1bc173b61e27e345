"""Retention and release decisions as pure logic (hub/retention.py), then one hand-off through HubState.

Milliseconds: no sockets, no threads.
"""
import pytest
import torch

from rlsync.hub.location import Location
from rlsync.hub.manifest import ManifestConfig, build_manifest
from rlsync.hub.retention import (KEEP_OLD, Action, ReleaseDecision, ReleaseView, RetentionConfig, SeedWorker,
                                  choose_seed_worker, decide_release, drop_seed, forget_below, forgettable,
                                  is_retained)
from rlsync.hub.shard import Shard
from rlsync.hub.state import PENDING, HubConfig, HubState

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
