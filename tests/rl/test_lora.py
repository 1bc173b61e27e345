"""LoRA end to end (docs/lora.md): the trainer trains an adapter over a frozen base; the base is published once, each
version is the adapter alone (naming its base inside its bytes); engines fetch adapters straight into LRU-bounded
slots, a request finishes on the revision it started with, and an evicted adapter is fetched again from the hub.

On the starting commit there was no `trainer.lora`, no `hub_adapter` route and no adapter engine.
"""
import pytest
import torch

from rlsync.config.compose import check_config, route_of, sync_shape
from rlsync.config.schema import TrainConfig
from rlsync.core.logprobs import token_logprobs
from rlsync.core.lora import LoraConfig
from rlsync.core.stall import StallClock
from rlsync.hub import ClientConfig, HubClient, HubConfig, Location, RetentionConfig, start_embedded_hub
from rlsync.rollout import RolloutEngine
from rlsync.sync import Side, SyncConfig, SyncModeError
from rlsync.sync.hub_adapter import ADAPTER_BASE, adapter_model
from rlsync.trainer import TorchBackend
from rlsync.workers.policy import build_policy
from needs import require  # tests/needs.py

require("peft")
LORA = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])


def lora_cfg(tiny_cfg, **over):
    return tiny_cfg(**{"trainer.lora": LORA, **over})


def test_a_lora_run_takes_the_adapter_route_and_a_route_that_sends_whole_models_is_refused(tiny_cfg):
    assert route_of(check_config(lora_cfg(tiny_cfg))).name == "hub_adapter"
    assert route_of(check_config(tiny_cfg())).name == "hub_full"  # rank 0: as before
    with pytest.raises(SyncModeError, match="trainer.lora.rank=4 needs sync.mode=hub"):
        route_of(check_config(lora_cfg(tiny_cfg, **{"sync.mode": "object_store"})))
    with pytest.raises(SyncModeError, match="trainer.backend=torch"):
        route_of(lora_cfg(tiny_cfg, **{"trainer.backend": "deepspeed"}))


class _Streamed:
    """An HF streamer (`put`/`end`) that keeps what it was given."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.flatten().tolist())

    def end(self):
        self.ended = True


def _engine(cfg, seed):
    model, task = build_policy(cfg.model, cfg.task, seed)
    eng = RolloutEngine(RolloutEngine.Config(max_new_tokens=4, do_sample=False), model, pad_token_id=0,
                        eos_token_id=1)
    eng.version = -1
    return eng, task


def _receiver(cfg, hub_client, engine, max_adapters):
    side = Side(sync=SyncConfig(max_adapters=max_adapters, variant=cfg.sync.variant, variant_by=cfg.sync.variant_by),
                model="policy", hub=hub_client,
                clock=StallClock(hub_client.worker_id, "rollout"), hub_address="", shape=sync_shape(cfg))
    return route_of(cfg).receiver(side, engine)


def test_adapters_through_the_hub_reach_the_engine_bit_exact_with_residency_and_refetch(tiny_cfg, tmp_path):
    cfg = check_config(lora_cfg(tiny_cfg))
    model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
    backend = TorchBackend(TorchBackend.Config(lora=LORA), model)
    adapter = backend.named_parameters_for_sync()
    assert adapter and all(".lora_A." in n or ".lora_B." in n for n in adapter)
    plain, _ = build_policy(cfg.model, cfg.task, cfg.seed)
    assert set(backend.base_parameters_for_sync()) == {n for n, _ in plain.named_parameters()}  # the HF names
    # the last 4 revisions stay retained: an evicted one is fetched again from whoever holds it (or its seed)
    with start_embedded_hub(journal=str(tmp_path / "journal.db"),
                            config=HubConfig(retention=RetentionConfig(retain_last=4))) as hub:
        clients = [HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py")) for _ in range(3)]
        for i, c in enumerate(clients):
            c.join(Location(host=f"h{i}"), f"w{i}")
        try:
            trainer, reader, peer = clients
            side = Side(sync=cfg.sync, model="policy", hub=trainer, clock=StallClock("t", "trainer"),
                        hub_address=hub.address, shape=sync_shape(cfg))
            pub = route_of(cfg).publisher(side, 0)
            engine, task = _engine(cfg, seed=cfg.seed + 1)  # another init: the base must come from the hub
            rcv = _receiver(cfg, reader, engine, max_adapters=2)
            ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
            mask = torch.ones_like(ids)
            sizes = []
            for v in range(3):  # versions 0, 1, 2: each a different adapter (as an optimizer step makes one)
                if v:
                    pub.release()
                    for t in adapter.values():
                        t.add_(torch.randn_like(t) * 0.05)
                    backend.version = v
                sizes.append(pub.publish(backend)["bytes"])
                rcv.ensure(v)
                assert engine.version == v and engine.adapter == (adapter_model("policy"), v)
                with engine.adapters.use(engine.adapter):
                    got, _ = token_logprobs(engine.model, ids, mask)
                want, _ = token_logprobs(backend.model, ids, mask)
                assert torch.equal(got, want)  # same base, same adapter, same numbers
            # a request streams its tokens as they are sampled (bench tenants' time to first token): the prompt,
            # then each token, before the call's re-score forward
            streamed = _Streamed()
            out = engine.generate([[3, 4, 5]], streamer=streamed)
            assert streamed.puts[0] == [3, 4, 5] and [t for p in streamed.puts[1:] for t in p] == out.response_ids[0]
            # the base was read once; each adapter version moved about the adapter's size
            base_bytes = sum(x.numel() * x.element_size() for x in backend.base_parameters_for_sync().values())
            assert sizes[0] == sum(x.numel() * x.element_size() for x in adapter.values()) < base_bytes / 5
            assert trainer.versions("policy")["committed"] == [0]  # the base: published once
            assert torch.equal(engine.adapters.tensors_of(engine.adapter)[ADAPTER_BASE], torch.tensor([0]))
            # max_adapters=2: v0 was evicted (released at the hub); v1 and v2 stay resident
            assert engine.adapters.resident() == [(adapter_model("policy"), 1), (adapter_model("policy"), 2)]
            held = {(r.model, r.version) for r in reader.held_ids()}
            assert (adapter_model("policy"), 0) not in held and (adapter_model("policy"), 2) in held
            # a request pinned on v1 keeps it: taking v0 again evicts the LRU unpinned one (v2), never v1
            key1 = (adapter_model("policy"), 1)
            with engine.adapters.use(key1):
                by = rcv.take(adapter_model("policy"), 0, use=False)  # evicted earlier: fetched again
                assert sum(by.values()) == sizes[0] + 8  # + the 8-byte base record
                assert engine.adapters.has(key1) and not engine.adapters.has((adapter_model("policy"), 2))
            # a peer holding v2 serves it back to the reader that evicted it
            other, _ = _engine(cfg, seed=cfg.seed + 2)
            _receiver(cfg, peer, other, max_adapters=4).take(adapter_model("policy"), 2)
            by = rcv.take(adapter_model("policy"), 2)
            assert set(by) <= {trainer.worker_id, peer.worker_id} and sum(by.values()) == sizes[0] + 8
        finally:
            for c in clients:
                c.leave()


def test_a_trainer_step_changes_only_the_adapter_and_the_base_stays_frozen(tiny_cfg):
    cfg = check_config(lora_cfg(tiny_cfg))
    model, task = build_policy(cfg.model, cfg.task, cfg.seed)
    backend = TorchBackend(TorchBackend.Config(lora=LORA), model)
    base0 = {n: x.clone() for n, x in backend.base_parameters_for_sync().items()}
    b_before = {n: x.clone() for n, x in backend.named_parameters_for_sync().items() if ".lora_B." in n}
    assert all(float(x.abs().sum()) == 0 for x in b_before.values())  # peft starts B at zero: the base's outputs
    from rlsync.core.batch import Batch

    ids = torch.randint(3, 10, (4, 8))
    rmask = torch.zeros_like(ids)
    rmask[:, 5:] = 1
    lp, _ = token_logprobs(backend.model, ids, torch.ones_like(ids))
    batch = Batch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=rmask, old_logprobs=lp * rmask,
                  rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]).view(-1, 1) * rmask, group_ids=torch.zeros(4, dtype=torch.long),
                  versions=torch.zeros(4, dtype=torch.long))
    backend.train_step(batch)
    assert all(torch.equal(base0[n], x) for n, x in backend.base_parameters_for_sync().items())
    assert any(not torch.equal(b_before[n], x) for n, x in backend.named_parameters_for_sync().items() if n in b_before)


def test_a_merged_adapter_samples_like_the_unmerged_one_and_never_writes_the_base(tiny_cfg):
    """sync.merge_adapter: the engine forwards through W + scaling * B @ A (a copy, made once per adapter key), the
    base tensors (the hub's replica) stay untouched, and a new base drops the merged copy."""
    cfg = check_config(lora_cfg(tiny_cfg))
    engines = []
    for merge in (False, True):
        eng, _ = _engine(cfg, seed=cfg.seed)
        slots = eng.enable_adapters(LORA, 4, merge=merge)
        for v in (0, 1):
            name, into = slots.reserve(("m", v))
            g = torch.Generator().manual_seed(v)
            for t in into.values():
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
            slots.commit(("m", v), name)
        engines.append((eng, slots))
    (plain, _), (merged, slots) = engines
    base0 = {n: t.clone() for n, t in slots.base_tensors().items()}
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    for v in (0, 1, 0):
        key = ("m", v)
        with plain.adapters.use(key):
            want, _ = token_logprobs(plain.model, ids, torch.ones_like(ids))
        with slots.use(key):
            got, _ = token_logprobs(merged.model, ids, torch.ones_like(ids))
        assert torch.allclose(got, want, atol=1e-5)
        live = {n.replace("base_model.model.", "").replace(".base_layer.", "."): p.data_ptr()
                for n, p in merged.model.named_parameters()}
        assert all(live[n] == t.data_ptr() for n, t in slots.base_tensors().items())  # after `use`: the base again
        out = merged.generate([[3, 4, 5]], adapter=key)
        assert out.response_ids == plain.generate([[3, 4, 5]], adapter=key).response_ids  # greedy: same tokens
    assert slots.merges == 3  # one per change of key, none for the second call on a key
    assert all(torch.equal(base0[n], t) for n, t in slots.base_tensors().items())  # the replica never written
    slots.base_written()  # the receiver fetched a new base version into the base tensors: the merged copy is stale
    with slots.use(("m", 0)):
        pass
    assert slots.merges == 4


@pytest.mark.parametrize("by", ["engine", "trainer"])
def test_a_bf16_base_for_the_adapter_pool_is_derived_once_and_the_adapters_stay_fp32(tiny_cfg, tmp_path, by):
    """sync.variant=bf16 with trainer.lora: engines serve `policy@bf16` of the base (derived once: by the first engine
    or by the trainer, then read from peers) with the trainer's fp32 adapters over it; int8 is refused up front."""
    with pytest.raises(SyncModeError, match="sync.variant=int8 has its own tensor layout"):
        check_config(lora_cfg(tiny_cfg, **{"sync.variant": "int8"}))
    cfg = check_config(lora_cfg(tiny_cfg, **{"sync.variant": "bf16", "sync.variant_by": by}))
    assert route_of(cfg).name == "hub_adapter"
    model, _ = build_policy(cfg.model, cfg.task, cfg.seed)
    backend = TorchBackend(TorchBackend.Config(lora=LORA), model)
    with torch.no_grad():
        for t in backend.named_parameters_for_sync().values():
            t.add_(0.05)  # an adapter that changes the outputs
    with start_embedded_hub(journal=str(tmp_path / "journal.db")) as hub:
        clients = [HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py")) for _ in range(3)]
        for i, c in enumerate(clients):
            c.join(Location(host=f"h{i}"), f"w{i}")
        try:
            trainer, *readers = clients
            side = Side(sync=cfg.sync, model="policy", hub=trainer, clock=StallClock("t", "trainer"),
                        hub_address=hub.address, shape=sync_shape(cfg))
            pub = route_of(cfg).publisher(side, 0)
            pub.publish(backend)
            pool = [_engine(cfg, seed=cfg.seed + 1 + i)[0] for i in range(2)]
            rcvs = [_receiver(cfg, c, e, max_adapters=2) for c, e in zip(readers, pool)]
            for r in rcvs:
                r.ensure(0)
            base = backend.base_parameters_for_sync()
            derived = sum(r.reader.derivations for r in rcvs) + (pub.deriver.derivations if pub.deriver else 0)
            assert derived == 1 and (pub.deriver is not None) == (by == "trainer")  # one cast across the run
            assert trainer.derived_from("policy@bf16", 0)["transform"] == "bf16"
            ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
            for e, c in zip(pool, readers):
                got = e.adapters.base_tensors()
                assert all(got[n].dtype == torch.bfloat16 and torch.equal(got[n], x.to(torch.bfloat16))
                           for n, x in base.items())
                slot = e.adapters.tensors_of(e.adapter)
                assert all(x.dtype == torch.float32 and torch.equal(slot[n], x)
                           for n, x in backend.named_parameters_for_sync().items())
                assert ("policy@bf16", 0) in {(h.model, h.version) for h in c.held_ids()}
                with e.adapters.use(e.adapter):
                    lp, _ = token_logprobs(e.model, ids, torch.ones_like(ids))
                want, _ = token_logprobs(backend.model, ids, torch.ones_like(ids))
                assert torch.allclose(lp.float(), want, atol=0.1) and not torch.equal(lp.float(), want)  # bf16 numbers
                assert len(e.generate([[3, 4, 5]]).response_ids[0]) == 4
        finally:
            for c in clients:
                c.leave()
