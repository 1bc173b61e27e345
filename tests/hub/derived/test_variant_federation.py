"""A variant through federation (hub/federation/gateway.py): dc1 follows only `policy@bf16`, so the variant
crosses the DC link once (half of the fp32 version's bytes) and dc1's readers read it inside dc1, bit-exact."""
import torch

from rlsync.hub import ClientConfig, Location, start_embedded_hub
from rlsync.hub.federation.gateway import Gateway, GatewayConfig
from rlsync.hub.tools.fakes import digest

from hub_clients import client_maker  # tests/hub/hub_clients.py


def test_a_variant_crosses_into_a_dc_once(tmp_path):
    cfg = ClientConfig(transport="tcp-py", hub_deadline_s=5.0, heartbeat_s=0.2)
    with start_embedded_hub(journal=str(tmp_path / "h0.db")) as h0, \
            start_embedded_hub(journal=str(tmp_path / "h1.db")) as h1:
        clients = []

        client = client_maker(cfg, clients)

        try:
            trainer, deriver = client(h0, "dc0", "t"), client(h0, "dc0", "e0")
            w = {"w": torch.randn(64 << 10, generator=torch.Generator().manual_seed(1)), "b": torch.randn(32)}
            trainer.publish("policy", 1, w)
            variant = deriver.fetch_variant(
                "policy", 1, "bf16", lambda v, into: {n: t.to(torch.bfloat16) for n, t in deriver.fetch("policy", v).tensors.items()})
            gw = Gateway(client(h0, "dc1", None), client(h1, "dc1", None), GatewayConfig(models=("policy@bf16",)))
            gw.start(Location(dc="dc1", host="gw"), loop=False)
            assert gw.step("policy@bf16") == 1
            r = gw.stats.replicated[-1]
            assert r.cross_bytes == r.nbytes == sum(t.numel() * 2 for t in w.values())  # the bf16 bytes, once
            readers = [client(h1, "dc1", f"r{i}") for i in range(2)]
            for rd in readers:
                got = rd.fetch("policy@bf16", "latest")
                assert digest(got.tensors) == digest(variant.tensors)
                assert set(got.bytes_by_source) <= {gw.stats.local_wid, readers[0].worker_id}  # inside dc1
            gw.stop()
        finally:
            for c in clients:
                c.leave()
