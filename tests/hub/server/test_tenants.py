"""Issue 34 item 2: tenants on one hub. Credentials scope publish / read / list; a refusal is typed, reveals
nothing (the same answer whether the model exists or not) and changes no state; quotas count only the
owner's retained versions; per-model policy; a reader's tickets carry its tenant's weight to the source."""
import pytest
import torch

from rlsync.hub import HubClient, Location
from rlsync.hub import errors as E
from rlsync.hub.server.loop import start_embedded_hub
from rlsync.hub.state import HubConfig, ModelPolicyConfig, TenantConfig

from books import book_agrees  # tests/hub/books.py

pytestmark = pytest.mark.timeout(60)
W = {"w": torch.arange(4096, dtype=torch.float32)}  # 16 KiB
NBYTES = 4096 * 4


@pytest.fixture
def thub(tmp_path):
    cfg = HubConfig(tenants=[TenantConfig(name="a", token="tok-a", publish=["a/*"], quota_bytes=int(2.5 * NBYTES)),
                             TenantConfig(name="b", token="tok-b", publish=["b/*"], read=["shared/*"], share=3.0)],
                    models=[ModelPolicyConfig(pattern="a/keep2", retain_last=2, fanout_cap=1, delta_mode="never")])
    h = start_embedded_hub(journal=str(tmp_path / "j.db"), config=cfg)
    clients = []

    def client(token, host):
        c = HubClient(h.address, token)
        c.join(Location(host=host), host)
        clients.append(c)
        return c

    yield h, client
    for c in clients:
        c.leave()
    h.stop()


def hub_view(h) -> tuple:
    s = h.server.state
    return (sorted(s.workers), sorted(s.replicas), sorted(s.fetches),
            {n: (list(m.committed), sorted(m.versions), sorted(m.pins)) for n, m in s.models.items()})


def test_a_tenant_cannot_read_or_see_another_tenants_model_and_learns_nothing(thub):
    h, client = thub
    a, b = client("tok-a", "ha"), client("tok-b", "hb")
    a.publish("a/policy", 1, W)
    b.publish("b/policy", 1, W)
    before = hub_view(h)
    answers = []
    for model in ("a/policy", "a/never-published"):  # exists / does not: the same refusal
        for call in (lambda: b.fetch(model, "latest"), lambda: b.fetch(model, 1), lambda: b.latest(model),
                     lambda: b.versions(model), lambda: b.publish(model, 2, W)):
            with pytest.raises(E.TenantAccessError) as e:
                call()
            answers.append(str(e.value).replace(model, "MODEL"))
    assert answers[:5] == answers[5:], "the refusal differs between a model that exists and one that does not"
    assert isinstance(E.TenantAccessError("x"), E.AuthError)
    assert hub_view(h) == before  # nothing changed, on either side
    book_agrees(h, b)
    assert b.held() == [f"{b.worker_id}:b/policy:1:tp0-pp0:live"]
    assert b.models() == {"b/policy": 1} and a.models() == {"a/policy": 1}
    assert set(b.stats()["models"]) == {"b/policy"}
    op = HubClient(h.address, h.token)  # the hub token: the operator sees everything
    assert op.models() == {"a/policy": 1, "b/policy": 1}
    assert torch.equal(a.fetch("a/policy", 1).tensors["w"], W["w"])  # the owner still reads it


def test_a_tenant_cannot_act_for_another_tenants_worker(thub):
    h, client = thub
    a, b = client("tok-a", "ha"), client("tok-b", "hb")
    a.publish("a/policy", 1, W)
    before = hub_view(h)
    for op, args in (("heartbeat", {}), ("leave", {})):
        with pytest.raises(E.TenantAccessError):
            b.session.call(op, wid=a.worker_id, **args)
    with pytest.raises(E.TenantAccessError):  # re-joining under a live worker's id
        b.session.call("join", name="x", location=b.session.location.to_wire(),
                       endpoint=b.session.endpoint.to_wire(), worker_id=a.worker_id)
    assert hub_view(h) == before
    with pytest.raises(E.AuthError, match="wrong hub token"):
        HubClient(h.address, "tok-nobody").latest("a/policy")


def test_the_quota_counts_the_owners_retained_versions_after_its_own_retention_and_refuses_changing_nothing(thub):
    h, client = thub
    a, b = client("tok-a", "ha"), client("tok-b", "hb")
    for v in range(1, 5):  # retain_last=1: each commit lets the previous version go (1 x 16 KiB <= 2.5 x)
        a.publish("a/policy", v, W)
        a.release("a/policy", v)
    big = {"w": torch.zeros(64 * 4096)}  # tenant b's versions never count against a's quota
    b.publish("b/policy", 1, big)
    a.publish("a/keep2", 1, W)  # a/policy v4 + a/keep2 v1 = 2 x 16 KiB
    before = hub_view(h)
    with pytest.raises(E.QuotaExceededError, match="quota"):  # retain_last=2 keeps v1 too: 3 x 16 KiB
        a.publish("a/keep2", 2, W)
    assert hub_view(h) == before and a.latest("a/keep2") == 1
    book_agrees(h, a)
    # 16 KiB (v4) + 16 (keep2 v1) + 12 (v5) would be 44 KiB: allowed, as v5's commit lets v4 go (a's own)
    a.publish("a/policy", 5, {"w": torch.zeros(3072)})
    a.release("a/policy", 5)
    with pytest.raises(E.QuotaExceededError):
        a.publish("a/keep2", 2, W)  # 12 + 16 + 16 KiB > 40
    a.publish("a/policy", 6, {"w": torch.zeros(2048)})
    a.release("a/policy", 6)
    a.publish("a/keep2", 2, W)  # 8 + 16 + 16 KiB: exactly the quota
    assert a.versions("a/keep2")["retained"] == [1, 2]
    assert h.server.state.policy("a/keep2").retention.cfg.retain_last == 2


def test_per_model_policy_applies_to_its_models_only():
    from rlsync.hub.state import HubState
    s = HubState(HubConfig(models=[ModelPolicyConfig(pattern="a/keep2", retain_last=2, fanout_cap=1,
                                                     delta_mode="never")]))
    p, d = s.policy("a/keep2"), s.policy("b/other")
    assert (p.retention.cfg.retain_last, p.planner.cfg.fanout_cap, p.delta.mode) == (2, 1, "never")
    assert (d.retention.cfg.retain_last, d.planner.cfg.fanout_cap, d.delta.mode) == (1, 4, "auto")
    assert s.policy("a/keep2@delta") is p and s.retained_window("a/keep2@delta") == 4  # the chain rule holds
    with pytest.raises(E.InvalidArgumentError, match="a/x"):
        HubState(HubConfig(models=[ModelPolicyConfig(pattern="a/x", fanout_cap=0)]))


def test_bad_tenant_configs_are_refused_at_start(tmp_path):
    for bad, why in (([TenantConfig(name="a", token="t"), TenantConfig(name="b", token="t")], "credential"),
                     ([TenantConfig(name="a", token="hubtok")], "credential"),
                     ([TenantConfig(name="a")], "exactly one"),
                     ([TenantConfig(name="a", token="t", priority="urgent")], "priority"),
                     ([TenantConfig(name="a", token="t", share=0)], "share")):
        with pytest.raises(E.InvalidArgumentError, match=why):
            start_embedded_hub(token="hubtok", journal=str(tmp_path / "j.db"), config=HubConfig(tenants=bad))


def test_a_tenants_reads_carry_its_weight_to_the_source_and_operator_reads_are_not_scheduled(thub):
    h, client = thub
    op = HubClient(h.address, h.token)
    op.join(Location(host="src"), "pool")
    b = client("tok-b", "hb")
    op.publish("shared/base", 1, W)
    got = b.fetch("shared/base", 1)
    assert torch.equal(got.tensors["w"], W["w"])
    served = op.session.data.shares.snapshot()["served"]
    assert served == {"b": NBYTES}, served
    op2 = HubClient(h.address, h.token)
    op2.join(Location(host="o2"), "op2")
    op2.fetch("shared/base", 1)  # the operator's read: not scheduled, not counted
    assert op.session.data.shares.snapshot()["served"] == {"b": NBYTES}
    op.leave()
    op2.leave()


def test_an_embedded_hubs_tenants_and_model_rules_come_from_hydra_overrides():
    from hydra import compose, initialize_config_module

    from rlsync.config.compose import register_configs, to_config
    register_configs()
    with initialize_config_module(config_module="rlsync.configs", version_base=None):
        c = compose(config_name="train", overrides=["+recipe=grpo_standalone",
                                                    "hub.server.tenants=[{name: a, token: ta, publish: ['a/*'], share: 3}]",
                                                    "hub.server.models=[{pattern: 'a/*', retain_last: 2}]"])
    server = to_config(c).hub.server
    assert server.tenants == [TenantConfig(name="a", token="ta", publish=["a/*"], share=3.0)]
    assert server.models == [ModelPolicyConfig(pattern="a/*", retain_last=2)]
