"""The indexed hub state answers exactly as the scans it replaced (issue 19: speed never changes behaviour).

Random operation sequences (join / re-join / move, publish incl. tp=2 groups and reader groups, fetch
plans, re-plans, completions, registrations and seeds, releases with and without hand-off, release
polls, heartbeats with their drops and tasks, expiry, leave) run on `HubState` and on `ScanState`
(tests/hub/state/scan_reference.py: the old scan-based queries). Every answer (plans with their sources and
units, release outcomes, drops, errors) and the whole state after every step must be equal; the
index must also equal one rebuilt from scratch.
"""
import random

import pytest
import torch

from rlsync.hub import errors as E
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import ManifestConfig, build_manifest
from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.state.retention import RetentionConfig
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import HubConfig, HubState
from rlsync.hub.state.index import StateIndex

from scan_reference import ScanState  # tests/hub/state/scan_reference.py

MANY = build_manifest({"w": torch.arange(16, dtype=torch.float32)}, ManifestConfig(chunk_bytes=8, pack_below=0))
SHARDS = {1: [Shard()], 2: [Shard(tp=0, tp_size=2), Shard(tp=1, tp_size=2)]}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def where(rng: random.Random) -> Location:
    return Location(dc=f"d{rng.randrange(2)}", rack=f"r{rng.randrange(2)}", host=f"h{rng.randrange(3)}")


def plan_view(p):
    return (p.fetch_id, p.version, p.held, [(rep.id, w.id, list(units)) for rep, w, units in p.sources])


def state_view(s: HubState):
    return ({k: (w.name, w.location, w.role, w.follow, w.last_seen, list(w.tasks)) for k, w in s.workers.items()},
            {k: (r.worker, r.model, r.version, r.shard, r.slot, r.full, r.releasing, r.origin)
             for k, r in s.replicas.items()},
            {k: (f.reader, f.model, f.version, f.shard, dict(f.sources), f.relay, set(f.excluded), dict(f.failed_at))
             for k, f in s.fetches.items()},
            {n: (dict((v, (x.committed, sorted(x.manifests))) for v, x in m.versions.items()), list(m.committed),
                 {g: (p.version, p.size, set(p.served)) for g, p in m.pins.items()}, m.forgot_below)
             for n, m in s.models.items()},
            set(s.pending_releases), dict(s.handoffs), dict(s.suspects))


def index_view(idx: StateIndex):
    def clean(d):
        return {k: v for k, v in d.items() if v}
    return (clean(idx.load), clean(idx.crossing), idx.crosses, {k: set(v) for k, v in idx.shard_replicas.items()},
            {k: set(v) for k, v in idx.readers_of.items()}, {k: set(v) for k, v in idx.worker_replicas.items()},
            {k: {p: set(x) for p, x in v.items()} for k, v in idx.places.items()},
            clean({k: clean(v) for k, v in idx.fetch_versions.items()}),
            clean({k: clean(v) for k, v in idx.replica_versions.items()}))


def call(s: HubState, op: str, *args):
    try:
        out = getattr(s, op)(*args)
    except Exception as e:  # noqa: BLE001 - a refusal must be the same refusal
        return ("error", type(e).__name__, str(e))
    return plan_view(out) if op in ("plan_fetch", "replan") else out


def heartbeat(s: HubState, wid: str):
    s.touch(wid)
    return s.drops_for(wid), s.tasks_for(wid)


def run_sequence(seed: int, steps: int, poll_every_step: bool = False) -> int:
    """`poll_every_step`: pending releases polled after every operation, as the server does after every
    pass of its loop (the fast state re-checks only those an event changed: hub/state/releases.py)."""
    rng = random.Random(seed)
    cfg = HubConfig(planner=PlannerConfig(fanout_cap=rng.choice([1, 1, 2, 4]), max_sources=rng.choice([1, 2]),
                                          stripe_min_bytes=rng.choice([1, 1 << 30]), cross_dc_streams=rng.choice([1, 2])),
                    retention=RetentionConfig(retain_last=rng.choice([1, 2]), prefer_seed=rng.random() < 0.3),
                    worker_timeout_s=5.0)
    clock = Clock()
    fast, ref = HubState(cfg, clock=clock), ScanState(cfg, clock=clock)
    pair = (fast, ref)
    names, version, checked = [], 0, 0
    for i in range(steps):
        ws = list(fast.workers)
        fetches = list(fast.fetches)
        op = rng.choices(["join", "rejoin", "publish", "fetch", "done", "replan", "register", "release", "poll",
                          "heartbeat", "expire", "leave", "tick"],
                         [3, 1, 2, 8, 5, 2, 2, 3, 2, 3, 1, 1, 2])[0]
        args: tuple | None = None
        if op == "join" or not ws:
            n = f"n{i}"
            names.append(n)
            role = "seed" if rng.random() < 0.15 else "worker"
            args = ("join", n, where(rng), {"tcp": n}, None, role, role == "seed" and rng.random() < 0.5)
        elif op == "rejoin":
            w = rng.choice(ws)
            rec = fast.workers[w]
            same = rng.random() < 0.7
            args = ("join", rec.name, where(rng) if rng.random() < 0.5 else rec.location,
                    dict(rec.endpoint) if same else {"tcp": f"other{i}"}, w, rec.role, rec.follow)
        elif op == "publish":
            version += rng.choice([1, 1, 2])
            group = rng.choice([1, 1, 2])
            for sh in SHARDS[group]:
                args = ("publish", rng.choice(ws), "p", version, sh, MANY)
                outs = [call(s, *args) for s in pair]
                assert outs[0] == outs[1], (seed, i, args, outs)
            args = None
        elif op == "fetch":
            sh = rng.choice(SHARDS[1] + SHARDS[2])
            ver = "latest" if rng.random() < 0.6 else rng.randrange(0, version + 2)
            grp = ("g", rng.choice([1, 2])) if rng.random() < 0.2 else None
            args = ("plan_fetch", rng.choice(ws), "p", ver, sh, grp)
        elif op == "done" and fetches:
            f = fast.fetches[rng.choice(fetches)]
            args = ("fetch_done", f.reader, f.id, rng.random() < 0.8)
        elif op == "replan" and fetches:
            f = fast.fetches[rng.choice(fetches)]
            srcs = list(f.sources)
            failed = rng.sample(srcs, rng.randrange(len(srcs) + 1)) if srcs else []
            units = sorted(rng.sample(range(len(MANY.units)), rng.randrange(1, len(MANY.units))))
            args = ("replan", f.reader, f.id, failed, units)
        elif op == "register" and fast.models.get("p"):
            m = fast.models["p"]
            v = rng.choice(list(m.versions))
            sh = rng.choice(SHARDS[2 if m.versions[v].group == (2, 1) else 1])
            args = ("register_replica", rng.choice(ws), "p", v, sh, rng.choice(["live", "seed"]), MANY)
        elif op == "release" and fast.replicas:
            r = fast.replicas[rng.choice(list(fast.replicas))]
            sh = Shard(tp=1, tp_size=2) if r.shard == "tp1-pp0" else Shard()  # a release names the shard by key
            args = ("release", r.worker, r.model, r.version, sh, r.slot, rng.random() < 0.3)
        elif op == "poll":
            args = ("poll_releases",)
        elif op == "heartbeat":
            outs = [heartbeat(s, w) for s, w in zip(pair, [rng.choice(ws)] * 2)]
            assert outs[0] == outs[1], (seed, i, outs)
        elif op == "expire":
            outs = [s.expire() for s in pair]
            assert outs[0] == outs[1], (seed, i, outs)
        elif op == "leave":
            w = rng.choice(ws)
            outs = [s.remove_worker(w) for s in pair]
            assert outs[0] == outs[1], (seed, i, outs)
        elif op == "tick":
            clock.t += rng.choice([0.5, 2.0, 6.0])
            for w in rng.sample(ws, len(ws) // 2):
                for s in pair:
                    s.touch(w)
        if args is not None:
            outs = [call(s, *args) for s in pair]
            assert outs[0] == outs[1], (seed, i, args, outs)
            checked += 1
        if poll_every_step:
            outs = [s.poll_releases() for s in pair]
            assert outs[0] == outs[1], (seed, i, "poll after", op, outs)
        assert state_view(fast) == state_view(ref), (seed, i, op)
        for s in pair:
            assert s.held_versions("p") == ScanState.held_versions(s, "p")
        live = index_view(fast._index)
        fast._index.rebuild()
        assert live == index_view(fast._index), (seed, i, op)
    return checked


@pytest.mark.parametrize("seed", range(20))
def test_indexed_state_equals_the_scans(seed):
    assert run_sequence(seed, 300) > 100  # enough operations were answered (not only refused)


@pytest.mark.parametrize("seed", range(100, 112))
def test_releases_rechecked_on_events_finish_when_the_scans_do(seed):
    assert run_sequence(seed, 300, poll_every_step=True) > 100


def test_planner_answers_as_its_reference():
    """The planner's per-plan savings (distances once, a tuple's sum remembered) pick what it picked."""
    from rlsync.hub.state.planner import Planner, Source
    from scan_reference import ReferencePlanner
    rng = random.Random(7)
    for _ in range(3000):
        cfg = PlannerConfig(fanout_cap=rng.choice([1, 2, 4]), max_sources=rng.choice([1, 2, 3]),
                            stripe_min_bytes=rng.choice([1, 50, 1 << 30]), cross_dc_streams=rng.choice([1, 2]),
                            source_hosts=rng.choice([(), ("h0",)]))
        srcs = [Source(f"r{i}", f"w{rng.randrange(6)}", where(rng), rng.random() < 0.7, rng.randrange(6),
                       rng.random() < 0.2, backup=rng.random() < 0.2) for i in range(rng.randrange(1, 9))]
        sizes = [rng.randrange(1, 40) for _ in range(rng.randrange(1, 5))]
        args = (where(rng), srcs, sizes, rng.randrange(3))
        want = ReferencePlanner(cfg).choose_sources(*args)
        p = Planner(cfg)
        assert p.choose_sources(*args) == want
        assert p.choose_sources(args[0], srcs, tuple(sizes), args[3]) == want  # a tuple's sum is remembered
        assert p.choose_sources(args[0], srcs, tuple(sizes), args[3]) == want
