"""sync.variant (rlsync/sync/hub_derived.py): the route is chosen from the sync section, and three engines
receiving the same version through it hold the bf16 variant with one derivation across them."""
import threading

import pytest
import torch

from rlsync.config.schema import TrainConfig
from rlsync.core.stall import StallClock
from rlsync.core.transforms import VariantReader
from rlsync.hub import ClientConfig, HubClient, Location, start_embedded_hub
from rlsync.rollout import RolloutEngine
from rlsync.sync import RunShape, Side, SyncConfig, SyncModeError, choose_route
from rlsync.workers.policy import build_policy


def test_route_from_the_sync_section_and_what_it_does_not_compose():
    assert choose_route(SyncConfig(variant="bf16"), RunShape()).name == "hub_derived"
    assert choose_route(SyncConfig(), RunShape()).name == "hub_full"
    with pytest.raises(SyncModeError, match="known variants bf16, int8"):
        choose_route(SyncConfig(variant="fp4"), RunShape())
    with pytest.raises(SyncModeError, match="deltas of a variant are not published"):
        choose_route(SyncConfig(variant="bf16", deltas=True), RunShape())
    # int8 has its own layout (weight_scale tensors): only an engine that starts from its checkpoint takes it
    with pytest.raises(SyncModeError, match="rollout.engine=hf cannot start in that variant's layout"):
        choose_route(SyncConfig(variant="int8"), RunShape())
    route = choose_route(SyncConfig(variant="int8"), RunShape(rollout_engine="vllm"))
    assert route.name == "hub_derived" and route.engine_variant(SyncConfig(variant="int8")) == "int8"
    assert route.engine_variant(SyncConfig(variant="bf16")) is None  # a cast: engines start from the model's layout
    assert choose_route(SyncConfig(), RunShape()).engine_variant(SyncConfig()) is None


def test_int8_into_an_engine_not_started_from_its_checkpoint_is_refused_before_any_read(tmp_path):
    cfg = TrainConfig()
    sync = SyncConfig(variant="int8", wait_s=30.0)
    with start_embedded_hub(journal=str(tmp_path / "journal.db")) as hub:
        trainer, reader = (HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py")) for _ in range(2))
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "engine")
        try:
            src, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            trainer.publish("policy", 1, {n: p.data for n, p in src.named_parameters()})
            model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            engine = RolloutEngine(RolloutEngine.Config(), model, pad_token_id=0, eos_token_id=1)
            engine.version = -1
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            route = choose_route(sync, RunShape(rollout_engine="vllm"))
            side = Side(sync=sync, model="policy", hub=reader, clock=StallClock("r", "rollout"), hub_address=hub.address)
            with pytest.raises(SyncModeError, match="started in the model's own layout, not the int8 variant's") as e:
                route.receiver(side, engine, params=model)
            assert e.value.key == "sync.variant"
            assert engine.version == -1 and all(torch.equal(p, before[n]) for n, p in model.named_parameters())
            assert trainer.versions("policy")["held"] == [1]
            with pytest.raises(Exception, match="policy@int8"):  # nothing derived, no lease taken
                trainer.versions("policy@int8")
        finally:
            reader.leave()
            trainer.leave()


def test_three_engines_one_derivation_same_bytes(tmp_path):
    cfg = TrainConfig()
    with start_embedded_hub(journal=str(tmp_path / "journal.db")) as hub:
        clients = [HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py")) for _ in range(4)]
        for i, c in enumerate(clients):
            c.join(Location(host=f"h{i}"), "trainer" if i == 0 else f"engine{i}")
        try:
            src, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            live = {n: p.data for n, p in src.named_parameters()}
            clients[0].publish("policy", 1, live)
            route = choose_route(SyncConfig(variant="bf16", wait_s=30.0), RunShape())
            receivers, engines = [], []
            for i, c in enumerate(clients[1:]):
                model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
                engine = RolloutEngine(RolloutEngine.Config(), model.to(torch.bfloat16), pad_token_id=0, eos_token_id=1)
                engine.version = -1
                side = Side(sync=SyncConfig(variant="bf16", wait_s=30.0), model="policy", hub=c,
                            clock=StallClock(f"r{i}", "rollout"), hub_address=hub.address)
                receivers.append(route.receiver(side, engine, params=model))
                engines.append(engine)
            ts = [threading.Thread(target=r.ensure, args=(1,)) for r in receivers]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            assert all(e.version == 1 for e in engines)
            assert sum(r.reader.derivations for r in receivers) == 1  # one conversion across the pool
            # every engine's fetch says what moved to it, the deriving one's too (the base it read: `sync/bytes`)
            fetched = [sum(x.attrs["bytes"] for x in r.clock.drain() if getattr(x, "name", "") == "fetch") for r in receivers]
            base_bytes = sum(t.numel() * t.element_size() for t in live.values())
            assert sorted(fetched) == sorted([base_bytes] + [base_bytes // 2] * 2), fetched
            want = {n: x.to(torch.bfloat16) for n, x in live.items()}
            for e in engines:
                got = e.named_parameters_for_sync()
                assert all(torch.equal(got[n], want[n]) for n in want)
            assert clients[0].derived_from("policy@bf16", 1)["transform"] == "bf16"
        finally:
            for c in clients:
                c.leave()


def test_trainer_derives_by_config_and_engines_take_only_the_variant(tmp_path):
    cfg = TrainConfig()
    sync = SyncConfig(variant="bf16", variant_by="trainer", wait_s=30.0)
    with start_embedded_hub(journal=str(tmp_path / "journal.db")) as hub:
        trainer, reader = (HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py")) for _ in range(2))
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "engine")
        try:
            route = choose_route(sync, RunShape())
            clock = StallClock("t", "trainer")
            pub = route.publisher(Side(sync=sync, model="policy", hub=trainer, clock=clock, hub_address=hub.address), 0)
            src, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            live = {n: p.data for n, p in src.named_parameters()}
            pub._publish(1, live)
            assert pub.deriver.derivations == 1
            engine = VariantReader(reader, "policy", "bf16")
            got = engine.fetch(1)  # held by the trainer: read, never derived here
            assert got.mode == "full" and engine.derivations == 0 and engine.base_bytes == 0 and got.nbytes == sum(t.numel() * 2 for t in live.values())
            assert set(got.bytes_by_source) == {trainer.worker_id}
        finally:
            reader.leave()
            trainer.leave()
