"""The simulator's federation mode at 10 DCs (small sizes: about a second): each DC's own real
HubState plans its reads, the home hub plans the one cross-DC read per DC (the gateway's)."""
from rlsync.sim.federation import federated, one_hub, run
from rlsync.sim.paper import PaperSetup


def small(**kw) -> PaperSetup:
    return PaperSetup(params=2e9, engines=60, dcs=10, trainer_gpus=128, **kw)


def test_each_dc_gets_exactly_one_copy_and_plans_its_reads_inside_itself():
    p = small()
    res = federated(p, poll_ms=50.0)
    assert set(res["copies_into_dc"]) == {f"dc{i}" for i in range(1, 10)}
    assert all(c == 1.0 for c in res["copies_into_dc"].values()), res["copies_into_dc"]
    assert len(res["hubs"]) == 10
    per_dc = -(-p.engines // p.dcs)
    for dc in (f"dc{i}" for i in range(1, 10)):
        assert res["hubs"][dc]["workers"] == per_dc + 1   # its engines and its gateway: nobody outside it
        g = res["gateways"][dc]
        assert g["polled_s"] <= 0.05 and g["polled_s"] < g["fetched_s"] <= g["committed_s"]


def test_a_hub_per_dc_costs_a_commit_per_dc_and_splits_the_control_plane():
    p = small()
    res = run(p, poll_ms=50.0)
    one, fed = res["systems"]["one hub"], res["systems"]["hub per DC"]
    assert one["copies_into_dc"] == fed["copies_into_dc"]             # the same bytes cross the WAN
    # no engine of a DC holds the version before its gateway holds all of it and committed it there
    for dc, g in fed["gateways"].items():
        assert fed["first_done_s"][dc] > g["committed_s"] >= g["fetched_s"]
    assert fed["max_hub_requests"] < one["max_hub_requests"] / 2          # 10 hubs share the requests
    assert one_hub(p)["copies_into_dc"] == one["copies_into_dc"]        # deterministic
