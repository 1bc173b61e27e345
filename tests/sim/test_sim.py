"""The simulator (rlsync/sim): fair sharing by hand, an analytic fanout, and the real hub deciding.

Pure logic and in-process: the whole file runs in about a second.
"""
import math

import pytest

from rlsync.hub.state.planner import Planner, PlannerConfig
from rlsync.hub.state import HubConfig
from rlsync.sim.cluster import SimCluster
from rlsync.sim.engine import Engine, Flow
from rlsync.sim.fairshare import max_min_rates
from rlsync.sim.network import Network

MB = 1e6


# ---------------------------------------------------------------- fair sharing, checkable by hand
def test_one_link_is_split_evenly():
    assert max_min_rates({"a": (["l"], None), "b": (["l"], None)}, {"l": 10.0}) == {"a": 5.0, "b": 5.0}


def test_a_flow_limited_elsewhere_leaves_its_share_to_the_others():
    # b crosses a 2-unit link too: it gets 2; a takes the other 8 of the shared 10.
    r = max_min_rates({"a": (["l"], None), "b": (["l", "slow"], None)}, {"l": 10.0, "slow": 2.0})
    assert r == pytest.approx({"a": 8.0, "b": 2.0})


def test_three_flows_two_bottlenecks_and_a_cap():
    # a, b, c on a 12 link; c and d on a 4 link; d capped at 1 -> c = 3, a = b = (12 - 3) / 2.
    r = max_min_rates({"a": (["x"], None), "b": (["x"], None), "c": (["x", "y"], None), "d": (["y"], 1.0)},
                      {"x": 12.0, "y": 4.0})
    assert r == pytest.approx({"a": 4.5, "b": 4.5, "c": 3.0, "d": 1.0})


def test_bad_flows_are_refused():
    with pytest.raises(KeyError):
        max_min_rates({"a": (["nope"], None)}, {"l": 1.0})
    with pytest.raises(ValueError):
        max_min_rates({"a": ([], None)}, {})


def test_rates_are_recomputed_when_a_flow_ends():
    net = Network(nic_bps=10 * MB)
    for n in ("s", "r1", "r2"):
        net.add(n)
    eng, done = Engine(net), {}
    eng.start(Flow(net.path("s", "r1"), 10 * MB, on_done=lambda f: done.__setitem__("small", eng.now)))
    eng.start(Flow(net.path("s", "r2"), 30 * MB, on_done=lambda f: done.__setitem__("big", eng.now)))
    eng.run()
    # Both at 5 MB/s until the small one ends at 2 s (10 MB); the big one then has 20 MB left at 10 MB/s.
    assert done == pytest.approx({"small": 2.0, "big": 4.0})


def test_a_dc_link_is_shared_by_every_flow_crossing_it():
    net = Network(nic_bps=100 * MB, dc_link_bps=10 * MB)
    net.add("t", dc="dc0")
    for i in range(4):
        net.add(f"r{i}", dc="dc1")
    assert net.path("t", "r0") == ("t:up", "dc:dc0:up", "dc:dc1:down", "r0:down")
    eng, done = Engine(net), []
    for i in range(4):
        eng.start(Flow(net.path("t", f"r{i}"), 10 * MB, on_done=lambda f: done.append(eng.now)))
    eng.run()
    assert done == pytest.approx([4.0] * 4)  # 40 MB through 10 MB/s


# ---------------------------------------------------------------- a simulated fanout vs the analytic value
def _fanout(n: int, planner: PlannerConfig, size=64 * MB, unit=1 * MB, nic=10 * MB):
    net = Network(nic_bps=nic)
    c = SimCluster(net, HubConfig(planner=planner), unit_bytes=int(unit))
    net.add("trainer")
    c.join("trainer")
    for i in range(n):
        net.add(f"r{i}")
        c.join(f"r{i}")
    c.publish("trainer", "policy", 1, int(size), rpc=False)
    done = {}
    for i in range(n):
        c.fetch(f"r{i}", "policy", on_done=lambda t, i=i: done.__setitem__(i, t))
    c.engine.run()
    assert not c.errors and len(done) == n
    return c, max(done.values(), default=0.0)


def test_a_relay_chain_ends_one_unit_per_hop_after_one_transfer():
    # fan-out cap 1: the hub chains 4 readers (trainer -> r0 -> r1 -> r2 -> r3), each a unit behind.
    _, t = _fanout(4, PlannerConfig(fanout_cap=1, max_sources=1))
    assert t == pytest.approx(64 / 10 + 3 * 1 / 10, rel=1e-6)


def test_trainer_only_pull_takes_n_transfers():
    _, t = _fanout(4, PlannerConfig(fanout_cap=1 << 20, max_sources=1, source_hosts=("trainer",)))
    assert t == pytest.approx(4 * 64 / 10, rel=1e-6)


def test_the_real_planner_decides(monkeypatch):
    """Change the planner (always the publisher's copy) and the simulated time becomes trainer-only pull.

    No fan-out cap, so the hub hands the planner every source in the nearest tier: the real one
    prefers peers (a chain, one unit per hop), the changed one the trainer (4 transfers)."""
    planner = PlannerConfig(fanout_cap=1 << 20, max_sources=1)
    _, t_real = _fanout(4, planner)
    assert t_real == pytest.approx(64 / 10 + 3 * 1 / 10, rel=1e-6)
    real = Planner.choose_sources
    calls = []

    def origin_only(self, reader, sources, unit_sizes, cross_dc_inflight=0):
        calls.append(len(sources))
        return real(self, reader, [s for s in sources if s.origin] or sources, unit_sizes, cross_dc_inflight)

    monkeypatch.setattr(Planner, "choose_sources", origin_only)
    _, t = _fanout(4, planner)
    assert len(calls) == 4 and t == pytest.approx(4 * 64 / 10, rel=1e-6)


# ---------------------------------------------------------------- retention and churn through the real hub
@pytest.mark.parametrize("min_full_copies", [1, 2])
def test_the_last_copy_waits_for_a_relay_before_it_goes(min_full_copies):
    """The trainer releases while the only reader is mid-fetch: retention says WAIT; the release
    completes when the reader holds the version (its fetch_done reaches the hub). With the default
    `min_full_copies=2` one reader's copy is not enough: the trainer offload-seeds first (a host copy
    at `offload_bps`), and that seed stays registered."""
    from rlsync.hub.state.retention import RetentionConfig

    net = Network(nic_bps=10 * MB)
    c = SimCluster(net, HubConfig(retention=RetentionConfig(min_full_copies=min_full_copies)),
                   unit_bytes=int(MB), offload_bps=1e9)
    for n in ("trainer", "r0"):
        net.add(n)
        c.join(n)
    c.publish("trainer", "policy", 1, int(20 * MB), rpc=False)
    got, released = [], []
    c.fetch("r0", "policy", on_done=got.append)
    c.engine.at(0.5, lambda: c.release("trainer", "policy", 1, then=released.append))
    c.engine.run()
    seeded = min_full_copies == 2
    assert got == pytest.approx([2.0]) and released == pytest.approx([2.0 + (0.02 if seeded else 0.0)])
    assert any(r.endswith(":seed") for r in c.hub.replicas) == seeded


def test_a_preempted_relay_is_planned_around_and_expires():
    c, _ = _fanout(0, PlannerConfig(fanout_cap=1, max_sources=1))
    net = c.net
    for i in range(3):
        net.add(f"r{i}")
        c.join(f"r{i}")
    done = {}
    for i in range(3):  # a chain trainer -> r0 -> r1 -> r2
        c.fetch(f"r{i}", "policy", on_done=lambda t, i=i: done.__setitem__(i, t))
    c.engine.at(3.0, c.preempt, "r0")
    c.engine.run()
    assert set(done) == {1, 2} and not c.errors
    assert c.wid["r0"] not in c.hub.workers  # expired after worker_timeout_s
    assert all(math.isfinite(t) and t > 64 / 10 for t in done.values())


# ---------------------------------------------------------------- the CLI
def test_paper_prints_every_assumption_and_a_ratio_per_baseline(tmp_path):
    """`python -m rlsync.sim paper` at a small scale (the default scale is a heavy run)."""
    import json
    import subprocess
    import sys
    from dataclasses import fields

    from rlsync.sim.paper import PaperSetup

    out = tmp_path / "paper.json"
    p = subprocess.run([sys.executable, "-m", "rlsync.sim", "paper", "--set", "engines=16", "--set", "trainer_gpus=64",
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    for f in fields(PaperSetup):
        assert f.name in p.stdout, f.name
    res = json.loads(out.read_text())
    assert set(res["workloads"]) == {"standalone", "elastic", "crossdc"}
    ratios = res["workloads"]["standalone"]["ratio_vs_rlsync"]
    assert set(ratios) == {"trainer-only p2p", "NCCL broadcast", "object store"}
    assert all(r > 0 for r in ratios.values())


def test_validate_compares_every_scenario_of_the_stored_measurement(tmp_path):
    """`python -m rlsync.sim validate --json F`: a row per scenario, F carries max_rel_error."""
    import json
    import subprocess
    import sys

    out = tmp_path / "v.json"
    p = subprocess.run([sys.executable, "-m", "rlsync.sim", "validate", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    res = json.loads(out.read_text())
    assert p.returncode == (0 if res["within_10pct"] else 1), p.stderr[-2000:]
    assert {r["scenario"] for r in res["rows"] if r["counted"]} == {"fanout", "elastic", "standalone", "crossdc"}
    assert res["max_rel_error"] == max(r["rel_error"] for r in res["rows"] if r["counted"])
    assert res["measured_from"]["commands"] and res["measured_from"]["commit"]
