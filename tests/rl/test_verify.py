"""rlsync/sync/verify.py: what the engine computes with, checked after every apply (docs/verify.md).

Each injected fault (an engine subclass or a pull hook, only to inject it; hub, data plane and engine
real) is detected, the engine is quarantined (version -1, a `verify_failed` event) and the version is
taken again from another replica; a sample made with weights that failed a check is dropped by the driver.
"""
from contextlib import contextmanager

import pytest
import torch

from rlsync.core.events import RolloutResult
from rlsync.core.stall import Event, StallClock
from rlsync.driver.schedule import verified_groups
from rlsync.hub import ClientConfig, HubClient, Location, start_embedded_hub
from rlsync.rollout import RolloutEngine, TinyModelConfig, build_tiny_model
from rlsync.sync import Side, SyncConfig
from rlsync.sync.hub_full import HubReceiver
from rlsync.sync.verify import PROBE_KEY, VerifyConfig, WeightsVerifyError, check_weights, publish_probe

VOCAB = 32


def tiny(seed: int = 0) -> torch.nn.Module:
    return build_tiny_model(TinyModelConfig(seed=seed, tie_word_embeddings=True), VOCAB)


@contextmanager
def rig(tmp_path, engine_cls=RolloutEngine, probe_every: int = 1, overlap: bool = True):
    """A hub, a trainer client holding `src` (published as v1 with its probe) and a reader's receiver."""
    with start_embedded_hub(journal=str(tmp_path / "journal.db")) as hub:
        trainer = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        reader = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        try:
            src = tiny(seed=1)
            trainer.publish("policy", 1, {n: p.data for n, p in src.named_parameters()})
            publish_probe(trainer, "policy", 1, src, 16)
            engine = engine_cls(RolloutEngine.Config(), tiny(seed=0), pad_token_id=0, eos_token_id=2)
            engine.version = -1
            clock = StallClock("r", "rollout")
            sync = SyncConfig(verify=VerifyConfig(probe_every=probe_every, overlap=overlap))
            side = Side(sync=sync, model="policy", hub=reader, clock=clock, hub_address=hub.address)
            yield trainer, reader, src, engine, HubReceiver(side, engine), clock
        finally:
            reader.leave()
            trainer.leave()


def events(clock, name):
    return [r.attrs for r in clock.drain() if isinstance(r, Event) and r.name == name]


def same_weights(engine, src) -> bool:
    live = engine.named_parameters_for_sync()
    return all(torch.equal(live[n], p.data) for n, p in src.named_parameters())


def test_a_clean_apply_passes_both_checks_and_the_probe_is_a_hub_annotation(tmp_path):
    with rig(tmp_path) as (trainer, reader, src, engine, receiver, clock):
        receiver.ensure(1)
        assert receiver.verify_generated() == set()  # the worker's call after generating: the check is done
        assert engine.version == 1 and same_weights(engine, src)
        assert receiver.verifier.checks == {"weights": 1, "probe": 1}
        assert events(clock, "verify")[0]["ok"] and not events(clock, "verify_failed")
        assert len(reader.annotations("policy", 1)[PROBE_KEY]["logprobs"]) == 15


@pytest.mark.parametrize("overlap", [True, False])
def test_a_byte_flipped_after_its_unit_was_checked_is_caught_and_healed_from_another_replica(tmp_path, overlap):
    with rig(tmp_path, overlap=overlap) as (trainer, reader, src, engine, receiver, clock):
        flips = []

        def flip_after_check(sources, dest, pull):
            out = pull(sources)  # every unit landed and passed its checksum
            if not flips:
                w = engine.named_parameters_for_sync()["model.layers.1.mlp.down_proj.weight"]
                w.view(-1).view(torch.uint8)[77] ^= 0x10
                flips.append(1)
            return out

        reader.set_pull_fault(flip_after_check)
        receiver.ensure(1)
        # overlapped: found while the batch generated, so its samples go (the driver drops v1's); else before
        assert receiver.verify_generated() == ({1} if overlap else set())
        failed = events(clock, "verify_failed")
        assert [(f["check"], f["version"]) for f in failed] == [("weights", 1)]
        assert "down_proj" in failed[0]["detail"]
        assert engine.version == 1 and same_weights(engine, src)  # re-applied from the trainer's copy


class SkipsALayer(RolloutEngine):
    """Fault: the apply never reaches one layer (its tensor is handed out as a scratch buffer)."""

    def named_parameters_for_sync(self):
        live = super().named_parameters_for_sync()
        live["model.layers.0.self_attn.o_proj.weight"] = live["model.layers.0.self_attn.o_proj.weight"].clone()
        return live

    def weights_readback(self):
        return {n: p.data for n, p in self.model.named_parameters()}


class ReportsNewHoldsOld(SkipsALayer):
    """Fault: the engine takes the version number but keeps computing with the weights it had."""

    def named_parameters_for_sync(self):
        return {n: p.data.clone() for n, p in self.model.named_parameters()}


@pytest.mark.parametrize("engine_cls", [SkipsALayer, ReportsNewHoldsOld])
def test_an_engine_that_does_not_hold_the_version_it_reports_is_quarantined(tmp_path, engine_cls):
    with rig(tmp_path, engine_cls, probe_every=0) as (trainer, reader, src, engine, receiver, clock):
        receiver.ensure(1)
        with pytest.raises(WeightsVerifyError, match="weights check failed"):  # units pack small tensors together
            receiver.verify_generated()
        assert receiver.verifier.failed == {1}  # what the worker would report: its samples are dropped
        assert engine.version == -1  # quarantined: the worker generates nothing with it
        assert len(events(clock, "verify_failed")) == receiver.sync.verify.reapply_attempts + 1


class _StaleHead(torch.nn.Module):
    """The output head's private copy of the (tied) embedding, as vLLM's CPU kernel packs it."""

    def __init__(self, weight):
        super().__init__()
        self.register_buffer("packed", weight.detach().clone())

    def forward(self, x):
        return x @ self.packed.t()


class StaleTiedHead(RolloutEngine):
    """Fault: the tied head keeps the embedding it was built with (docs/vllm.md): no parameter shows it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.model.lm_head = _StaleHead(self.model.model.embed_tokens.weight)


def test_a_stale_tied_head_passes_the_byte_check_and_fails_the_probe(tmp_path):
    with rig(tmp_path, StaleTiedHead) as (trainer, reader, src, engine, receiver, clock):
        with pytest.raises(WeightsVerifyError, match="probe check failed"):
            receiver.ensure(1)
        assert same_weights(engine, src)  # every parameter holds v1: only the probe sees the head
        assert {f["check"] for f in events(clock, "verify_failed")} == {"probe"} and engine.version == -1


def test_a_converting_engine_is_compared_with_its_staging_converted_by_the_receiver():
    src = {n: p.data for n, p in tiny(seed=1).named_parameters()}
    from rlsync.hub.model.manifest import ManifestConfig, build_manifest

    manifest = build_manifest(src, ManifestConfig())
    engine_bf16 = {n: t.to(torch.bfloat16) for n, t in src.items()}
    assert check_weights(manifest, engine_bf16, staged=src) == []
    engine_bf16["model.norm.weight"][3] += 1
    assert check_weights(manifest, engine_bf16, staged=src) == ["model.norm.weight"]
    staged = {n: t.clone() for n, t in src.items()}
    staged["model.layers.0.mlp.up_proj.weight"].view(-1).view(torch.uint8)[5] ^= 1  # flipped after its check
    bad = check_weights(manifest, engine_bf16, staged=staged)  # every tensor of the unit that holds the byte
    assert "staging:model.layers.0.mlp.up_proj.weight" in bad and all(n.startswith("staging:") for n in bad)


def test_digests_made_as_a_version_lands_check_a_converting_engine_without_its_staging():
    """The overlapped vLLM check (docs/verify.md, "Overlap"): the expected bf16 digests are made once from the
    staging; afterwards the staging may be refilled and the engine's buffers alone are compared with them."""
    from rlsync.hub.model.manifest import ManifestConfig, build_manifest
    from rlsync.sync.verify import ConvertedDigests, expected_digests

    src = {n: p.data.clone() for n, p in tiny(seed=1).named_parameters()}
    manifest = build_manifest(src, ManifestConfig())
    digests = expected_digests(manifest, src, torch.bfloat16)
    engine_bf16 = {n: t.to(torch.bfloat16) for n, t in src.items()}
    for t in src.values():
        t.zero_()  # the next prefetch refills the staging: the digests do not need it
    assert isinstance(digests, ConvertedDigests) and check_weights(manifest, engine_bf16, digests) == []
    engine_bf16["model.layers.1.self_attn.q_proj.weight"].view(-1).view(torch.uint8)[3] ^= 0x08
    assert check_weights(manifest, engine_bf16, digests) == ["model.layers.1.self_attn.q_proj.weight"]
    with pytest.raises(WeightsVerifyError, match="staging does not match"):  # a stage that checks nothing itself
        expected_digests(manifest, src, torch.bfloat16, recheck=True)
    same = build_manifest(engine_bf16, ManifestConfig())  # a bf16 variant: its unit checksums are the expectation
    assert expected_digests(same, engine_bf16, torch.bfloat16) == {} and check_weights(same, engine_bf16, {}) == []
    # an int8 variant (int8 weights, fp32 scales) in an engine started from its checkpoint holds the manifest's own
    # dtypes: no converted digests are made (dtype None), its unit checksums are the expectation
    from rlsync.core.transforms import get_transform, specs_of

    t8 = get_transform("int8")
    q = t8.allocate(t8.specs(specs_of(engine_bf16)))
    t8.apply({n: x.float() for n, x in engine_bf16.items()}, q)
    m8 = build_manifest(q, ManifestConfig())
    held = {n: x.clone() for n, x in q.items()}
    assert expected_digests(m8, q, None) == {} and check_weights(m8, held, ConvertedDigests()) == []
    held["model.layers.0.mlp.up_proj.weight"].view(-1).view(torch.uint8)[7] ^= 1
    assert "model.layers.0.mlp.up_proj.weight" in check_weights(m8, held, ConvertedDigests())


def test_the_driver_drops_and_counts_samples_of_a_version_that_failed_verification():
    from rlsync.core.batch import Batch

    def group(v):
        ids = torch.ones(2, 4, dtype=torch.long)
        mask = torch.tensor([[0, 0, 1, 1]] * 2)
        tv = torch.full_like(ids, 3)
        tv[:, 3] = v  # switched to v in flight at the last token
        return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=mask, old_logprobs=torch.zeros(2, 4),
                     rewards=torch.zeros(2), versions=torch.full((2,), 3), token_versions=tv)

    class Counter:
        quarantined_samples = 0

    res = RolloutResult(worker="w", version=3, groups=[group(3), group(4)], unverified_versions=[4])
    kept = verified_groups(res, Counter)
    assert len(kept) == 1 and Counter.quarantined_samples == 2


def test_in_flight_a_version_switched_in_while_generating_that_fails_marks_that_batch(tmp_path):
    """sync.inflight: v2 is staged into the spare buffers as it commits (a bit flipped after its units were
    checked) and switched in by `generate`; the check after the batch fails, so the worker reports v2 (the
    driver drops the batch's v2 samples), and v2 is taken again into the spare buffers and switched in."""
    with start_embedded_hub(journal=str(tmp_path / "j2.db")) as hub:
        trainer = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        reader = HubClient(hub.address, hub.token, config=ClientConfig(transport="tcp-py"))
        trainer.join(Location(host="t"), "trainer")
        reader.join(Location(host="r"), "reader")
        engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=4), tiny(seed=0), pad_token_id=0, eos_token_id=2)
        engine.version = -1
        clock = StallClock("r", "rollout")
        side = Side(sync=SyncConfig(inflight=True, verify=VerifyConfig(probe_every=0)), model="policy", hub=reader,
                    clock=clock, hub_address=hub.address)
        src = tiny(seed=1)
        live = {n: p.data for n, p in src.named_parameters()}
        trainer.publish("policy", 1, live)
        receiver = HubReceiver(side, engine)
        try:
            receiver.ensure(1)
            assert engine.version == 1 and receiver.verify_generated() == set()
            flips = []

            def flip_after_check(sources, dest, pull):
                out = pull(sources)
                if not flips:
                    engine.next_buffers()["model.norm.weight"].view(-1).view(torch.uint8)[9] ^= 0x20
                    flips.append(1)
                return out

            reader.set_pull_fault(flip_after_check)
            trainer.release("policy", 1)
            for t in live.values():
                t.add_(0.01)
            trainer.publish("policy", 2, live)
            assert receiver.follower.wait_staged(2, 30.0)
            out = engine.generate([[1, 5, 6], [1, 7, 8]])
            assert out.version == 2 or (out.token_versions is not None and int(out.token_versions.max()) == 2)
            assert receiver.verify_generated() == {2}
            assert [f["version"] for f in events(clock, "verify_failed")] == [2]
            assert engine.version == 2 and same_weights(engine, src)  # taken again, switched in
        finally:
            receiver.close()
            reader.leave()
            trainer.leave()
