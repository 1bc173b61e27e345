"""rlsync/sync/: the weights' path behind one seam — routes chosen from the run's `sync` section, engines
that declare what they can take, and a receiver that waits for its version with one parked call.

On the starting commit the route was a `sync.mode` string compared in three files, the engine was probed
with `getattr(engine, "stages_weights", False)`, and a rollout worker waiting for a version asked the hub
for `latest` every 5 ms (rollout.weight_poll_s).
"""
import threading
import time

import pytest
import torch
from waiting import wait_for

from rlsync.config.compose import check_config, route_of, sync_shape
from rlsync.config.schema import TrainConfig
from rlsync.core.stall import StallClock
from rlsync.hub import ClientConfig, HubClient, Location, start_embedded_hub
from rlsync.rollout import RolloutEngine
from rlsync.sync import (WEIGHT_SYNCS, EngineCaps, EngineCapsError, Side, SyncConfig, SyncModeError, WeightSync,
                         caps_of, choose_route, register_weight_sync)
from rlsync.sync.hub_full import HubReceiver
from rlsync.workers.policy import build_policy


@pytest.mark.parametrize("over, route", [
    ({}, "hub_full"),
    ({"sync.deltas": True}, "hub_delta"),
    ({"trainer.backend": "deepspeed", "trainer.zero_stage": 3}, "hub_sharded"),
    ({"trainer.backend": "deepspeed", "trainer.zero_stage": 3, "trainer.publish": "gathered"}, "hub_full"),
    ({"trainer.backend": "deepspeed", "trainer.zero_stage": 3, "sync.deltas": True}, "hub_delta"),
    ({"sync.mode": "object_store"}, "object_store"),
    ({"sync.mode": "broadcast"}, "broadcast"),
])
def test_each_run_gets_one_registered_route_from_its_sync_section(tiny_cfg, over, route):
    cfg = check_config(tiny_cfg(**over))
    assert route_of(cfg).name == route and route_of(cfg) is WEIGHT_SYNCS.get(route)


def test_sync_mode_values_come_from_the_registry():
    cfg = TrainConfig()
    cfg.sync.mode = "carrier_pigeon"
    with pytest.raises(SyncModeError, match="known: broadcast, hub, object_store"):
        check_config(cfg)


def test_a_new_route_is_one_registered_class_and_the_run_can_choose_it():
    @register_weight_sync("test_pigeon")
    class Pigeon(WeightSync):
        mode = "pigeon"
        publisher, receiver = WEIGHT_SYNCS.get("hub_full").publisher, WEIGHT_SYNCS.get("hub_full").receiver

    try:
        assert choose_route(SyncConfig(mode="pigeon"), sync_shape(TrainConfig())) is Pigeon
    finally:
        WEIGHT_SYNCS._table.pop("test_pigeon")  # the session's other tests see the built-ins only


class Undeclared:
    version = 0

    def named_parameters_for_sync(self):
        return {}


class StagedWithoutStaging(Undeclared):
    sync_caps = EngineCaps(staged=True)


class StagedNoInflight(Undeclared):
    sync_caps = EngineCaps(in_place_fetch=True)
    version = -1


def test_engines_declare_what_they_can_take_and_a_false_declaration_is_refused():
    cfg = TrainConfig()
    model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
    hf = RolloutEngine(RolloutEngine.Config(), model, pad_token_id=0, eos_token_id=1)
    assert caps_of(hf) == EngineCaps(in_place_fetch=True, load_state=True, inflight=True, verify=True, adapters=True) \
        and not caps_of(hf).reads_hub
    with pytest.raises(EngineCapsError, match="declares no `sync_caps`"):
        caps_of(Undeclared())
    with pytest.raises(EngineCapsError, match="has no apply_staged, attach_hub, close, prefetch_latest, update_latest"):
        caps_of(StagedWithoutStaging())


def test_a_receiver_waits_for_its_version_with_one_parked_call_not_a_poll(tmp_path):
    cfg = TrainConfig()
    with start_embedded_hub(journal=str(tmp_path / "journal.db")) as hub:
        trainer = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        reader = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        try:
            src, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            live = {n: p.data for n, p in src.named_parameters()}
            trainer.publish("policy", 1, live)
            model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            engine = RolloutEngine(RolloutEngine.Config(), model, pad_token_id=0, eos_token_id=1)
            engine.version = -1
            side = Side(sync=SyncConfig(wait_s=30.0), model="policy", hub=reader, clock=StallClock("r", "rollout"),
                        hub_address=hub.address)
            receiver = route_of(cfg).receiver(side, engine, params=model)
            assert isinstance(receiver, HubReceiver)
            before = trainer.stats()["rpc_by_op"]
            waiting = threading.Thread(target=receiver.ensure, args=(2,), daemon=True)
            waiting.start()
            t0 = time.monotonic()
            while trainer.stats()["rpc_by_op"].get("wait_latest", 0) == before.get("wait_latest", 0):
                assert time.monotonic() - t0 < 30 and waiting.is_alive(), "the receiver never asked to wait"
                time.sleep(0.02)  # polling the test's condition, with a deadline
            assert engine.version == -1                                           # parked: nothing fetched
            v2 = {n: x + 1.0 for n, x in live.items()}
            trainer.publish("policy", 2, v2)
            waiting.join(60)
            assert not waiting.is_alive() and engine.version == 2
            assert all(torch.equal(engine.named_parameters_for_sync()[n], x) for n, x in v2.items())
            after = trainer.stats()["rpc_by_op"]
            assert after.get("latest", 0) == before.get("latest", 0)             # no poll of `latest`
            assert after["wait_latest"] - before.get("wait_latest", 0) == 1      # one parked call
        finally:
            reader.leave()
            trainer.leave()


def test_inflight_receiver_stages_each_version_as_it_commits_and_the_engine_switches_without_draining(tmp_path):
    """sync.inflight: the receiver's follower fetches each committed version into the engine's spare buffers
    while nobody asks for it; the next rollout call switches to it with no fetch in its path (the pause is
    re-pointing the parameters) and records an in-flight `engine_update`. An engine that cannot is refused."""
    cfg = TrainConfig()
    with start_embedded_hub(journal=str(tmp_path / "journal.db")) as hub:
        trainer = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        reader = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        receiver = None
        try:
            src, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            live = {n: p.data for n, p in src.named_parameters()}
            trainer.publish("policy", 1, live)
            model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
            engine = RolloutEngine(RolloutEngine.Config(), model, pad_token_id=0, eos_token_id=1)
            engine.version = -1
            clock = StallClock("r", "rollout")
            side = Side(sync=SyncConfig(inflight=True, kv_policy="keep"), model="policy", hub=reader, clock=clock,
                        hub_address=hub.address)
            with pytest.raises(EngineCapsError, match="needs an engine with inflight"):
                route_of(cfg).receiver(side, StagedNoInflight())
            receiver = route_of(cfg).receiver(side, engine, params=model)
            receiver.ensure(1)
            assert engine.version == 1 and engine.kv_policy == "keep"
            trainer.release("policy", 1)
            v2 = {n: x + 1.0 for n, x in live.items()}
            for n, x in v2.items():
                live[n].copy_(x)
            trainer.publish("policy", 2, live)
            wait_for(lambda: receiver.follower.staged >= 2, 30, "the follower staging v2")
            assert engine.version == 1  # staged beside the live weights, not switched yet
            before = reader.stats()["rpc_by_op"].get("fetch", 0)
            receiver.ensure(2)
            assert engine.version == 2 and reader.stats()["rpc_by_op"].get("fetch", 0) == before  # no fetch in the path
            assert all(torch.equal(engine.named_parameters_for_sync()[n], x) for n, x in v2.items())
            ups = [e for e in clock.drain() if getattr(e, "name", "") == "engine_update"]
            assert ups and ups[-1].attrs["version"] == 2 and ups[-1].attrs["in_flight"] is False  # between calls
            assert ups[-1].attrs["decode_pause_s"] == ups[-1].attrs["pause_s"] >= 0  # `sync/decode_pause_s` per step
        finally:
            if receiver is not None:
                receiver.close()
            reader.leave()
            trainer.leave()
