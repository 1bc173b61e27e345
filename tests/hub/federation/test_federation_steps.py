"""Gateway steps driven one at a time, in process (two embedded hubs, real clients and data planes):
a DC skips versions it missed and commits the newest, and a second gateway that lost the race drops
its copy instead of looping. The process-level behaviour is in test_federation.py."""
import torch

from rlsync.hub import ClientConfig, Location, start_embedded_hub
from rlsync.hub.federation.gateway import Gateway, GatewayConfig
from rlsync.hub.tools.fakes import digest

from hub_clients import client_maker  # tests/hub/hub_clients.py


def _model(v: int) -> dict:
    g = torch.Generator().manual_seed(v)
    return {"w": torch.randn(64 << 10, generator=g), "b": torch.randn(32, generator=g)}


def test_a_dc_skips_what_it_missed_commits_the_newest_and_a_second_gateway_drops_its_copy(tmp_path):
    cfg = ClientConfig(transport="tcp-py", hub_deadline_s=5.0, heartbeat_s=0.2)  # (a leave waits out a heartbeat)
    with start_embedded_hub(journal=str(tmp_path / "h0.db")) as h0, \
            start_embedded_hub(journal=str(tmp_path / "h1.db")) as h1:
        clients = []
        client = client_maker(cfg, clients)
        trainer = client(h0, "dc0", "t")
        gws = [Gateway(client(h0, "dc1", None), client(h1, "dc1", None), GatewayConfig()) for _ in range(2)]
        for i, g in enumerate(gws):
            g.start(Location(dc="dc1", host=f"gw{i}"), loop=False)
        a, b = gws
        assert a.step("policy") is None               # nothing published at home yet: nothing to do
        w = {1: _model(1)}
        trainer.publish("policy", 1, w[1])
        pend = b._fetch("policy", 1)                  # b crosses first ...
        assert a.step("policy") == 1                  # ... a commits first
        assert b._commit("policy", pend) is None      # b finds v1 committed and drops its copy
        assert b.stats.skipped and not b._pending and b.step("policy") is None
        reader = client(h1, "dc1", "r")
        got = reader.fetch("policy", "latest")
        assert got.version == 1 and digest(got.tensors) == digest(w[1])
        assert set(got.bytes_by_source) == {a.stats.local_wid}
        for v in (2, 3):                              # dc1 misses v2 entirely
            w[v] = _model(v)
            trainer.release("policy", v - 1)
            trainer.publish("policy", v, w[v])
        assert a.step("policy") == 3
        assert a.stats.replicated[-1].cross_bytes == a.stats.replicated[-1].nbytes
        got = reader.fetch("policy", "latest")
        assert got.version == 3 and digest(got.tensors) == digest(w[3])
        assert set(reader.versions("policy")["committed"]) <= {1, 3}  # v2: never visible in dc1
        for c in clients:
            c.leave()


def test_one_home_per_model_is_enforced_across_restarts(tmp_path):
    """dc1's hub follows `policy` from h0 (its home) through a gateway: a trainer publishing `policy` (or its
    delta) there is refused, and so is a gateway bringing `policy` from another hub or bringing a model dc1 is
    home to; each refusal typed, nothing changed; the rule survives dc1's hub restarting on its journal."""
    import pytest

    from rlsync.hub import errors as E

    cfg = ClientConfig(transport="tcp-py", hub_deadline_s=5.0, heartbeat_s=0.2)
    clients = []
    client = client_maker(cfg, clients)
    with start_embedded_hub(journal=str(tmp_path / "h0.db")) as h0, \
            start_embedded_hub(journal=str(tmp_path / "h2.db")) as h2:
        with start_embedded_hub(journal=str(tmp_path / "h1.db")) as h1:
            client(h0, "dc0", "t0").publish("policy", 1, _model(1))
            gw = Gateway(client(h0, "dc1", None), client(h1, "dc1", None), GatewayConfig())
            gw.start(Location(dc="dc1", host="gw"), loop=False)
            assert gw.step("policy") == 1 and gw.local.session.publishes_for == gw.home.hub_id
            h1_id, before = client(h1, "dc1", "probe").hub_id, h1.server.state.models["policy"].committed[:]
            intruder = client(h1, "dc1", "t1")
            with pytest.raises(E.HomeHubError, match="follows hub"):
                intruder.publish("policy", 2, _model(2))
            with pytest.raises(E.HomeHubError, match="follows hub"):
                intruder.publish_fetched_delta("policy", 2, {"base1.u0": torch.zeros(8, dtype=torch.uint8)})
            assert h1.server.state.models["policy"].committed == before and not intruder.held_ids()
            intruder.publish("mine", 1, _model(7))  # a model dc1's hub is home to: its own history
            client(h2, "dc2", "t2").publish("policy", 5, _model(5))  # another history of `policy`, on h2
            for home, model, why in ((h2, "policy", "already follows hub"), (h0, "mine", "own history")):
                if model == "mine":
                    client(h0, "dc0", "t0b").publish("mine", 3, _model(3))
                other = Gateway(client(home, "dc1", None), client(h1, "dc1", None), GatewayConfig(models=(model,)))
                other.start(Location(dc="dc1", host=f"gw-{model}"), loop=False)
                with pytest.raises(E.HomeHubError, match=why):
                    other.step(model)
                assert h1.server.state.models[model].committed == ([1] if model == "mine" else before)
            for c in clients:
                c.leave()
            clients.clear()
        with start_embedded_hub(journal=str(tmp_path / "h1.db")) as h1:  # restarted on its journal
            again = client(h1, "dc1", "t1")
            assert again.hub_id == h1_id
            with pytest.raises(E.HomeHubError, match="follows hub"):
                again.publish("policy", 2, _model(2))
            for c in clients:
                c.leave()
