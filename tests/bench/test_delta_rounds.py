"""The delta workloads' arithmetic (rlsync/bench/delta_rounds.py), checked against hand-computed values:
the hub's assumed link tiers, the upper median, the summary of the timed rounds, and the DC link's
byte counter (the last one needs root to build a topology; skipped otherwise)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlsync.bench.delta_rounds import median, summarize, tier_gbps, wan_bytes
from rlsync.bench.topo import Topology, check_support, measure_rate
from rlsync.bench.workload_specs import crossdc_spec

WHY = check_support()


def test_tier_gbps_is_the_emulated_links():
    # 250 Mbit/s NICs for host, rack and DC tiers; a 25 Mbit/s DC link across.
    assert tier_gbps(250e6, 25e6) == [0.25, 0.25, 0.25, 0.025]
    # One DC: the cross tier falls back to the NIC rate.
    assert tier_gbps(1e9, None) == [1.0, 1.0, 1.0, 1.0]


def test_median_is_the_upper_one():
    assert median([1.0, 3.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 3.0  # even count: the upper of the middle two
    assert median([7.0]) == 7.0


def _r(stall, wall, delta_bytes=0, wan=0, trainer=0, publish=0.0, modes=("full",), exact=True):
    return {"stall_s": stall, "wall_s": wall, "delta_bytes": delta_bytes, "wan_bytes": wan,
            "trainer_data_bytes": trainer, "publish_delta_s": publish, "modes": list(modes), "exact": exact}


def _rounds(pull: bool = True, wan: bool = True) -> dict:
    k = 1 if wan else 0
    out = {
        "rlsync delta": [_r(2.0, 1.0, 100, 150 * k, 110, 0.1, ("delta",)),
                         _r(4.0, 3.0, 300, 330 * k, 303, 0.3, ("delta", "full")),
                         _r(3.0, 2.0, 200, 260 * k, 200, 0.2, ("delta",))],
        "rlsync full": [_r(9.0, 4.0), _r(6.0, 5.0), _r(12.0, 6.0)],
    }
    if pull:
        out["per-worker pull"] = [_r(18.0, 8.0), _r(24.0, 9.0), _r(30.0, 10.0)]
    return out


def test_summarize_hand_computed():
    s = summarize(_rounds(), model_bytes=1000)
    # medians: delta stall {2,3,4} -> 3, wall {1,2,3} -> 2; full 9 / 5; pull 24 / 9
    assert s["total_stall_s_median"] == {"rlsync delta": 3.0, "rlsync full": 9.0, "per-worker pull": 24.0}
    assert s["wall_s_median"] == {"rlsync delta": 2.0, "rlsync full": 5.0, "per-worker pull": 9.0}
    assert s["speedup_delta_vs_full"] == 3.0          # 9 / 3
    assert s["wall_speedup_delta_vs_full"] == 2.5     # 5 / 2
    assert s["delta_bytes_per_version"] == 200
    assert s["delta_ratio_to_full"] == 0.2            # 200 / 1000
    assert s["publish_delta_s_median"] == 0.2
    assert s["delta_modes"] == ["delta", "full"]
    # the worst round: 150/100, 330/300, 260/200 -> 1.5; trainer's data 110/100, 303/300, 200/200 -> 1.1
    assert s["crossing_bytes_per_delta"] == 1.5
    assert s["crossing_data_bytes_per_delta"] == 1.1
    assert s["speedup_delta_vs_per_worker_pull"] == 8.0   # 24 / 3
    assert s["speedup_full_vs_per_worker_pull"] == 2.667  # 24 / 9, rounded to 3 places
    assert s["exact"] is True


def test_summarize_leaves_out_what_was_not_measured():
    rounds = _rounds(pull=False, wan=False)
    rounds["rlsync full"][1]["exact"] = False
    s = summarize(rounds, model_bytes=1000)
    assert "speedup_delta_vs_per_worker_pull" not in s and "speedup_full_vs_per_worker_pull" not in s
    assert "crossing_bytes_per_delta" not in s  # one DC: no link counter read
    assert s["exact"] is False                  # one reader's bytes differed in one round


@pytest.mark.skipif(WHY is not None, reason=f"topology emulation: {WHY}")
def test_wan_bytes_counts_what_enters_the_remote_dc():
    """2 MB sent from dc0 into dc1 raise dc1's counter by the payload plus TCP/IP headers (under 10%);
    the reverse direction's data does not count toward dc1."""
    n = 2_000_000
    with Topology(crossdc_spec(1, "200mbit", 0.5)) as topo:
        c = SimpleNamespace(topo=topo)
        before = wan_bytes(c, 1)
        measure_rate(topo, "trainer", "ro0", n)
        into = wan_bytes(c, 1) - before
        assert n <= into < 1.1 * n, into
        before = wan_bytes(c, 1)
        measure_rate(topo, "ro0", "trainer", n)  # out of dc1: only ACKs go in
        assert wan_bytes(c, 1) - before < 0.1 * n
