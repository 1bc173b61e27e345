"""The vLLM rollout engine fed in place by the hub: log-probs follow each update, versions are
tagged and never torn, corrupt staging is refused, the staging replica serves peers.

One engine for the whole module (see conftest.py). Log-prob gaps are compared with each other
(right weights vs the previous version's), not with a fixed figure of speed.
"""
import logging
import threading

import pytest
import torch

from vllm_helpers import logprob_gap

pytestmark = pytest.mark.timeout(600)


def _with_weights(rig, seed):
    """Put the trainer-side HF model at the weights of the version written with `seed`."""
    from vllm_helpers import new_version

    new_version(rig.params, rig.base, seed)


def test_logprobs_follow_update(rig):
    """After an update vLLM's per-token log-probs match the trainer's recomputation on the same
    weights (bf16 engine vs fp32 trainer), and no longer match the previous version."""
    v1 = rig.publish(seed=1)
    s1 = rig.stage.update("latest")
    assert s1.version == v1 == rig.engine.version and s1.apply_s > 0 and s1.fetch_s > 0
    v2 = rig.publish(seed=2)
    s2 = rig.stage.update(v2)
    assert s2.bytes_by_source and sum(s2.bytes_by_source.values()) == s2.nbytes
    out = rig.engine.generate(rig.prompts * 2)
    assert out.version == v2
    gap_new = logprob_gap(rig.model, out)           # trainer model holds v2 now
    _with_weights(rig, seed=1)
    gap_old = logprob_gap(rig.model, out)
    _with_weights(rig, seed=2)
    # bf16 vs fp32 on the same weights: a few hundredths; against another version: far more.
    assert gap_new < 0.1, gap_new
    assert gap_old > 3 * gap_new, (gap_old, gap_new)


def test_greedy_matches_trainer_first_tokens(rig):
    """Greedy decoding after an update: vLLM's first response token equals the trainer model's
    greedy token for every prompt (later tokens may part on bf16 near-ties). A warm-up batch in between
    (what a joiner runs before taking a version) changes neither the version nor what greedy answers."""
    v = rig.publish(seed=3)
    rig.stage.update(v)
    rig.engine.config.do_sample = False
    try:
        out = rig.engine.generate(rig.prompts)
        switches = len(rig.engine.switches)
        assert rig.engine.warm_up(rig.prompts[0]) > 0
        assert rig.engine.version == v and len(rig.engine.switches) == switches
        again = rig.engine.generate(rig.prompts)
    finally:
        rig.engine.config.do_sample = True
    assert again.version == v and again.response_ids == out.response_ids
    with torch.no_grad():
        for p, got in zip(rig.prompts, out.response_ids):
            logits = rig.model(torch.tensor([p])).logits[0, -1]
            assert got[0] == int(logits.argmax()), (got, int(logits.argmax()))


def test_direct_apply_equals_layerwise_and_repacks_the_tied_head(rig):
    """The direct apply (the default, rollout/vllm/direct.py) and vLLM's layerwise reload leave the
    engine identical for the same weights (greedy tokens and log-probs), and both re-pack the tied
    lm_head: a version that moves the embedding far is followed by vLLM's log-probs (a stale head,
    what vLLM's own reload leaves on CPU, put them ~25 nats per token away)."""
    from vllm_helpers import bf16_exact

    saved = {n: t.clone() for n, t in rig.params.items()}
    specs = tuple((n, tuple(t.shape)) for n, t in rig.params.items())
    v = rig.engine.version
    rig.engine.config.do_sample = False
    try:
        out = {}
        for seed, mode in ((7, "direct"), (8, "layerwise"), (8, "direct")):
            g = torch.Generator().manual_seed(seed)
            e = rig.params["model.embed_tokens.weight"]
            e.copy_(bf16_exact(rig.base["model.embed_tokens.weight"] * (1 + 0.5 * torch.randn(e.shape, generator=g))))
            rig.engine.apply(iter(rig.params.items()), v, specs=specs, mode=mode)
            out[seed, mode] = o = rig.engine.generate(rig.prompts)
            assert o.version == v and logprob_gap(rig.model, o) < 0.1, (seed, mode, logprob_gap(rig.model, o))
        a, b = out[8, "layerwise"], out[8, "direct"]
        assert a.response_ids == b.response_ids
        assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5), (a.logprobs - b.logprobs).abs().max()
    finally:
        rig.engine.config.do_sample = True
        for n, t in saved.items():
            rig.params[n].copy_(t)
        rig.engine.apply(iter(rig.params.items()), v, specs=specs)


def test_prefetch_then_apply_reports_version_and_pause(rig):
    """N updates through prefetch (engine keeps generating) + apply (the pause): the engine reports
    each version, batches are tagged with it, and the pause is the apply plus checks."""
    for seed in (4, 5):  # two updates: the second prefetches over a staging replica the first already applied
        v = rig.publish(seed=seed)
        assert rig.stage.prefetch(v)
        out = rig.engine.generate(rig.prompts)      # generating with the previous version meanwhile
        assert out.version == v - 1
        assert rig.stage.wait_staged(timeout_s=120) == v
        stats = rig.stage.apply_staged()
        assert stats.version == v == rig.engine.version
        assert stats.pause_s >= stats.apply_s > 0
        assert set(stats.metrics()) >= {"sync/fetch_s", "sync/apply_s", "sync/pause_s"}
        assert rig.engine.generate(rig.prompts[:1]).version == v
    assert rig.client.latest("policy") == rig.engine.version


def test_update_never_tears_a_batch(rig):
    """An apply requested while a batch is generating waits for it: the whole batch comes from the
    old version (its log-probs match the old weights), the next batch from the new one."""
    old = rig.publish(seed=7)
    rig.stage.update(old)
    new = rig.publish(seed=8)
    rig.stage.prefetch(new)
    rig.stage.wait_staged(timeout_s=120)
    started, result = threading.Event(), {}
    llm_engine = rig.engine.llm.llm_engine
    orig_step = llm_engine.step

    def step_and_signal():
        started.set()  # the batch's first decode step: it holds the engine lock from here on
        return orig_step()

    llm_engine.step = step_and_signal
    rig.engine.config.max_new_tokens = 32
    try:
        t = threading.Thread(target=lambda: result.setdefault("out", rig.engine.generate(rig.prompts * 2)))
        t.start()
        assert started.wait(120)
        stats = rig.stage.apply_staged()            # blocks until the batch is done
        t.join()
    finally:
        del llm_engine.step  # the class's own again
        rig.engine.config.max_new_tokens = 12
    out = result["out"]
    assert out.version == old and stats.version == new == rig.engine.version
    _with_weights(rig, seed=7)
    gap_old = logprob_gap(rig.model, out)
    _with_weights(rig, seed=8)
    gap_new = logprob_gap(rig.model, out)
    assert gap_old < 0.1 and gap_new > 3 * gap_old, (gap_old, gap_new)
    assert rig.engine.generate(rig.prompts[:1]).version == new


def test_corrupt_staging_fails_loudly_and_recovers(rig):
    """A staging byte flipped after the fetch: the apply raises, the engine refuses to generate,
    the corrupt replica is withdrawn; a fresh update of the same version works again."""
    from rlsync.rollout.vllm.engine import WeightApplyError
    from rlsync.rollout.vllm.stage import WeightIntegrityError

    v = rig.publish(seed=9)
    rig.stage.prefetch(v)
    assert rig.stage.wait_staged(timeout_s=120) == v
    name = "model.layers.3.mlp.down_proj.weight"
    rig.stage._staging[name].view(-1)[17] += 1.0     # a fault injected into the staging buffer
    with pytest.raises(WeightIntegrityError, match="down_proj"):
        rig.stage.apply_staged()
    with pytest.raises(WeightApplyError):
        rig.engine.generate(rig.prompts[:1])
    assert not any(f":policy:{v}:" in rid for rid in rig.client.held())
    stats = rig.stage.update(v)
    assert stats.version == v == rig.engine.version
    out = rig.engine.generate(rig.prompts)
    assert logprob_gap(rig.model, out) < 0.1


def test_staging_replica_serves_a_joining_peer(rig):
    """The engine's staging buffers are a hub replica: a worker joining later reads the version
    from them, not from the trainer (which has stepped and released it)."""
    from rlsync.hub import HubClient, Location

    v = rig.publish(seed=10)
    rig.stage.update(v)
    rig.trainer.release("policy", v)
    rig.version_released = True
    peer = HubClient(rig.hub.address, token=rig.hub.token)
    peer.join(Location(host="h0"), name="joiner")
    try:
        got = peer.fetch("policy", "latest")
        assert got.version == v
        assert set(got.bytes_by_source) == {rig.client.worker_id}
        assert all(torch.equal(got.tensors[n], rig.stage._staging[n]) for n in got.tensors)
    finally:
        peer.leave()
    rig.trainer.publish("policy", v + 1, rig.params)   # leave the rig with a live trainer version
    rig.version = v + 1


def test_follow_prefetches_each_new_version_while_generating(rig):
    """With `follow`, a committed version lands in staging without anyone asking, while the engine
    keeps generating the old one; applying it then pauses only for the apply."""
    import time

    rig.stage.follow(poll_s=0.02)
    try:
        v = rig.publish(seed=11)
        deadline = time.monotonic() + 120
        while rig.stage.staged_version != v and time.monotonic() < deadline:
            assert rig.engine.generate(rig.prompts[:1]).version < v   # still the old version
        assert rig.stage.staged_version == v
        stats = rig.stage.apply_staged()
        assert stats.version == v == rig.engine.version and stats.fetch_s > 0
        assert stats.pause_s < stats.apply_s + 1.0   # the fetch is not in the pause
    finally:
        rig.stage.close()


def test_update_waits_for_a_prefetch_started_meanwhile(rig):
    """The follower may start a prefetch between `update`'s wait and its lock (seen in a grpo_vllm run:
    the update then reported a version it never applied). The update waits for it and applies the
    version: what it reports is what the engine holds."""
    v = rig.publish(seed=12)
    assert rig.stage.prefetch(v)
    with rig.stage._lock:                       # the moment after `update` waited, before `_update`
        stats = rig.stage._update(v, False)
    assert stats.version == v == rig.engine.version and stats.apply_s > 0
    assert rig.engine.generate(rig.prompts[:1]).version == v
    again = rig.stage.update(v)                 # already held: nothing fetched, nothing applied
    assert again.version == v and again.apply_s == 0 and again.nbytes == 0


def test_sharded_zero3_version_lands_fused_in_staging_and_applies_exactly(rig):
    """Issue 20 item 3 (TP=1): a version published as two ZeRO-3 partitions (two hub workers, as a 2-rank
    trainer does) is read whole by the engine's stage: q/k/v and gate/up land in place as row blocks of one
    fused staging buffer per layer (vLLM's qkv_proj / gate_up_proj order), every tensor bit-exact against the
    trainer's, each rank serving only its partition; after the apply vLLM's own fused weight buffers equal the
    trainer's tensors cast to bf16, and its log-probs follow the new weights."""
    from rlsync.hub import HubClient, Location
    from rlsync.hub.reshard.layout import record, zero3_layout
    from rlsync.hub.reshard.read import publish_shard
    from rlsync.hub.model.manifest import dtype_name
    from rlsync.rollout.vllm.stage import HubWeightStage
    from vllm_helpers import new_version

    new_version(rig.params, rig.base, seed=21)
    layout = zero3_layout({n: (tuple(t.shape), dtype_name(t.dtype)) for n, t in rig.params.items()}, 2)
    ranks, v = [], rig.engine.version + 1
    try:
        for r in range(2):
            c = HubClient(rig.hub.address, token=rig.hub.token)
            c.join(Location(host="h0"), name=f"zero3-rank{r}")
            ranks.append(c)
            live = {}  # this rank's ZeRO-3 partitions (p.ds_tensor: the real elements, then padding)
            for p in layout.ranks[r]:
                live[p.name] = torch.zeros(p.length + p.padding, dtype=rig.params[p.name].dtype)
                live[p.name][:p.length] = rig.params[p.name].reshape(-1)[p.start:p.start + p.length]
            publish_shard(c, "policy_z3", v, layout, r, live)
        stage = HubWeightStage(rig.client, rig.engine, "policy_z3", layout=layout)
        stats = stage.update(v)
        assert stats.version == v == rig.engine.version
        staged = stage._staging
        for n, t in rig.params.items():
            assert torch.equal(staged[n], t), n
        q, k, vv = (staged[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
        assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == vv.untyped_storage().data_ptr()
        assert k.data_ptr() == q.data_ptr() + q.nbytes and vv.data_ptr() == k.data_ptr() + k.nbytes
        want = {ranks[r].worker_id: sum(p.length * 4 for p in layout.ranks[r]) + len(record(layout, r)) for r in range(2)}
        assert stats.bytes_by_source == want

        def fused_buffers(worker, specs):  # the direct apply's persistent buffers, in vLLM's fused layout
            return {k: t.clone() for k, t in worker.__dict__["_rlsync_direct_plans"][specs].buffers.items()}

        specs = tuple((n, shape) for n, (shape, _) in layout.specs().items())
        bufs = rig.engine.llm.collective_rpc(fused_buffers, args=(specs,))[0]
        p = "model.layers.0.self_attn"
        assert torch.equal(bufs[f"{p}.qkv_proj"], torch.cat([q, k, vv]).to(torch.bfloat16))
        m = "model.layers.0.mlp"
        assert torch.equal(bufs[f"{m}.gate_up_proj"], torch.cat([rig.params[f"{m}.gate_proj.weight"],
                                                                 rig.params[f"{m}.up_proj.weight"]]).to(torch.bfloat16))
        out = rig.engine.generate(rig.prompts)
        assert out.version == v and logprob_gap(rig.model, out) < 0.1
        stage._release(v)
    finally:
        for c in ranks:
            c.leave()


def test_bf16_variant_applies_as_the_fp32_path_with_half_the_bytes(rig):
    """A stage reading the bf16 variant (docs/derived.md) takes half the bytes into bf16 staging and leaves the
    engine exactly as today's fp32 path does (greedy tokens and log-probs equal), for weights that are not
    bf16-exact: the variant's cast is bit for bit the conversion the engine's apply did itself. From the
    second fetch its staging is fused and every linear layer is packed straight from it (no copy), and the
    kernels keep nothing of it: zeroing the staging afterwards changes no token and no log-prob."""
    from rlsync.hub import HubClient, Location
    from rlsync.rollout.vllm.stage import HubWeightStage
    from rlsync.rollout.vllm.staging import specs_of
    from rlsync.rollout.vllm.worker_apply import direct_parts

    client = HubClient(rig.hub.address, token=rig.hub.token)
    client.join(Location(host="h0"), name="vllm0-bf16")
    bf16 = HubWeightStage(client, rig.engine, config=HubWeightStage.Config(variant="bf16"))
    rig.engine.config.do_sample = False
    try:
        v = rig.publish(41)
        rig.trainer.release("policy", v)
        g = torch.Generator().manual_seed(41)
        for p in rig.params.values():  # off the bf16 grid: both paths must round alike
            p.add_(p.abs() * 1e-3 * torch.rand(p.shape, generator=g))
        rig.version += 1
        rig.trainer.publish("policy", rig.version, rig.params)
        s1 = rig.stage.update(rig.version)
        a = rig.engine.generate(rig.prompts)
        rig.trainer.release("policy", rig.version)
        rig.version += 1
        rig.trainer.publish("policy", rig.version, rig.params)  # the same bytes again, read the other way
        s2 = bf16.update(rig.version)
        b = rig.engine.generate(rig.prompts)
        assert b.version == rig.version == a.version + 1
        assert s2.nbytes * 2 == s1.nbytes and {t.dtype for t in bf16._staging.values()} == {torch.bfloat16}
        assert a.response_ids == b.response_ids and torch.equal(a.logprobs, b.logprobs)
        assert bf16.variant.derivations == 1 and client.derived_from("policy@bf16", rig.version)["transform"] == "bf16"
        # from its second fetch the variant's staging is fused: every linear layer is packed straight from it
        rig.trainer.release("policy", rig.version)
        rig.version += 1
        rig.trainer.publish("policy", rig.version, rig.params)
        bf16.update(rig.version)
        c = rig.engine.generate(rig.prompts)
        assert a.response_ids == c.response_ids and torch.equal(a.logprobs, c.logprobs)
        specs = specs_of(bf16._manifest)
        parts = rig.engine.llm.collective_rpc(direct_parts, args=(specs,))[0]
        assert parts["layers_from_staging"] == 4 * 30 and parts["layers_copied"] == 0, parts
        q = "model.layers.2.self_attn.q_proj.weight"
        assert rig.engine.readback(specs)[q].data_ptr() == bf16._staging[q].data_ptr()  # what its kernel was packed from
        client.release("policy@bf16", rig.version)  # the buffers are ours again (the mutability contract)
        for t in bf16._staging.values():  # what the next prefetch does to staging while the engine generates
            t.zero_()
        d = rig.engine.generate(rig.prompts)
        assert a.response_ids == d.response_ids and torch.equal(a.logprobs, d.logprobs)
    finally:
        rig.engine.config.do_sample = True
        bf16.close()
        client.leave()


def test_verify_reads_back_the_engines_bytes_and_the_probe_catches_a_stale_tied_head(rig, monkeypatch):
    """docs/verify.md on the real engine: after a direct apply the engine's own bf16 buffers equal the staged
    version as the receiver converts it; a byte flipped in staging after its check is found; vLLM's own reload
    without the tied-head re-pack (the fault, injected by skipping `tied_heads`) passes every byte check and
    fails the fixed probe (bf16 tolerance)."""
    import rlsync.rollout.vllm.worker_apply as wa
    from rlsync.rollout.vllm.rl_engine import HubFedVllmEngine
    from rlsync.sync.verify import TOLERANCE, check_weights, probe_logprobs, probe_token_ids

    v = rig.publish(seed=11)
    rig.stage.update(v)
    fed = HubFedVllmEngine(rig.engine)
    fed.stage = rig.stage
    manifest, staged = fed.verify_source()
    assert check_weights(manifest, fed.weights_readback(), staged) == []
    tokens = probe_token_ids(rig.model.config.vocab_size, 16)

    def gap() -> float:
        mine, ref = fed.probe_logprobs(tokens), probe_logprobs(rig.model, tokens)
        return sum(abs(a - b) for a, b in zip(mine, ref)) / len(ref)

    right = gap()
    assert right <= TOLERANCE["bfloat16"], right
    w = staged["model.layers.3.mlp.up_proj.weight"].view(-1).view(torch.uint8)
    w[1001] ^= 0x40
    try:
        bad = check_weights(manifest, fed.weights_readback(), staged)
        assert "staging:model.layers.3.mlp.up_proj.weight" in bad and all(n.startswith("staging:") for n in bad)
    finally:
        w[1001] ^= 0x40
    saved = {n: t.clone() for n, t in rig.params.items()}
    specs = tuple((n, tuple(t.shape)) for n, t in rig.params.items())
    try:
        monkeypatch.setattr(wa, "tied_heads", lambda model: [])  # vLLM's own reload: the head keeps its old pack
        e = rig.params["model.embed_tokens.weight"]
        e.mul_(1 + 0.5 * torch.randn(e.shape, generator=torch.Generator().manual_seed(12)))
        rig.engine.apply(iter(rig.params.items()), v, specs=specs, mode="layerwise")
        stale = gap()
        logging.getLogger(__name__).info("probe gap: right weights %.4f, stale tied head %.4f", right, stale)
        assert stale > TOLERANCE["bfloat16"], (right, stale)
    finally:
        monkeypatch.undo()
        for n, t in saved.items():
            rig.params[n].copy_(t)
        rig.engine.apply(iter(rig.params.items()), v, specs=specs)


def test_a_prefetched_version_is_checked_while_the_engine_generates_and_a_changed_byte_heals(rig):
    """docs/verify.md, "Overlap", on the real engine behind the receiver: the expected bf16 digests are made as
    the version lands in staging, so the check after the apply reads only the engine's buffers and runs while it
    generates; a byte of the engine's weights changed after the apply (injected at its read-back) fails it, the
    batch's version is reported (its samples dropped) and the version is taken again, checked in the pause."""
    from rlsync.core.stall import Event, StallClock
    from rlsync.hub import HubClient, Location
    from rlsync.rollout.vllm.rl_engine import HubFedVllmEngine
    from rlsync.sync import Side, SyncConfig
    from rlsync.sync.hub_full import HubReceiver
    from rlsync.sync.verify import VerifyConfig
    from waiting import wait_for  # tests/waiting.py

    client = HubClient(rig.hub.address, token=rig.hub.token)
    client.join(Location(host="h0"), name="vllm0-receiver")
    fed, clock = HubFedVllmEngine(rig.engine), StallClock("r", "rollout")
    side = Side(sync=SyncConfig(verify=VerifyConfig(probe_every=0)), model="policy", hub=client, clock=clock,
                hub_address=rig.hub.address)
    receiver = HubReceiver(side, fed)  # its stage follows the hub; digests made as each version lands

    def events(name):
        return [r.attrs for r in clock.drain() if isinstance(r, Event) and r.name == name]
    try:
        flips = []
        for seed in (21, 22):
            v = rig.publish(seed)
            wait_for(lambda: v in fed._expected, 120, f"v{v} staged and its digests made")
            receiver.ensure(v)
            out = fed.generate(rig.prompts[:1])  # while the weights check runs
            assert out.version == v
            if flips:
                assert receiver.verify_generated() == {v}  # the batch generated with it: dropped by the driver
                assert fed.version == v and receiver.verifier.checks["weights"] >= 2  # re-applied, checked again
                assert logprob_gap(rig.model, fed.generate(rig.prompts[:1])) < 0.1
                break
            assert receiver.verify_generated() == set()
            ok = events("verify")
            assert ok and ok[-1]["overlapped"] and ok[-1]["checks"] == "weights" and ok[-1]["version"] == v
            readback = fed.weights_readback

            def flipped_readback():  # the fault: the engine computes with a byte the version does not have
                got = readback()
                if not flips:
                    got["model.layers.2.mlp.up_proj.weight"].view(-1).view(torch.uint8)[11] ^= 0x04
                    flips.append(1)
                return got
            fed.weights_readback = flipped_readback
        failed = [e for e in clock.drain() if isinstance(e, Event) and e.name == "verify_failed"]
        assert flips and [f.attrs["check"] for f in failed] == ["weights"] and "up_proj" in failed[0].attrs["detail"]
    finally:
        receiver.close()
        client.leave()


def test_a_variant_packed_from_staging_is_read_back_before_the_next_prefetch_refills_it(rig):
    """docs/verify.md, the bf16 variant: a layer packed straight from fused staging is read back from that staging,
    so its overlapped check must read it before the next version's prefetch refills it. Injected ordering (no
    sleep): the trainer commits the next version while the check runs, and the check reads only once the follower
    has had its chance to prefetch it (its poll, then any prefetch it started joined). Before the fix the prefetch
    refilled the staging under the check (a false failure: batch dropped, re-apply); now it waits for the check."""
    from rlsync.core.stall import StallClock
    from rlsync.hub import HubClient, Location
    from rlsync.rollout.vllm.rl_engine import HubFedVllmEngine
    from rlsync.sync import Side, SyncConfig
    from rlsync.sync.hub_derived import HubDerivedReceiver
    from rlsync.sync.verify import VerifyConfig
    from waiting import wait_for  # tests/waiting.py

    client = HubClient(rig.hub.address, token=rig.hub.token)
    client.join(Location(host="h0"), name="vllm0-bf16-receiver")
    fed = HubFedVllmEngine(rig.engine)
    side = Side(sync=SyncConfig(variant="bf16", verify=VerifyConfig(probe_every=0)), model="policy", hub=client,
                clock=StallClock("r", "rollout"), hub_address=rig.hub.address)
    receiver = HubDerivedReceiver(side, fed)  # its stage follows the hub, reading the bf16 variant
    check, raced = receiver.verifier._weights, []

    def racing(version, manifest, staged, readback=None):
        if readback is not None and fed.stage._fused and not raced:  # the overlapped check of a packed version
            raced.append(rig.publish(33))  # the trainer commits the next version while the check runs
            fed.stage.poll()  # the follower's turn (it polls every 50 ms): prefetch it, if the stage lets it
            fed.stage.wait_staged()  # any prefetch started has finished writing the staging
        return check(version, manifest, staged, readback)
    receiver.verifier._weights = racing
    try:
        for seed in (31, 32):  # the variant's staging is fused from its second fetch: then packed from it
            v = rig.publish(seed)
            wait_for(lambda: v in fed._expected, 120, f"v{v}'s variant staged")
            receiver.ensure(v)
            assert fed.generate(rig.prompts[:1]).version == v  # while the weights check runs
            assert receiver.verify_generated() == set(), f"v{v} failed its check"
        q = "model.layers.2.self_attn.q_proj.weight"
        assert raced and fed.weights_readback()[q].data_ptr() == fed.stage._staging[q].data_ptr()
        nxt = raced[0]  # held off while the check read, prefetched once it was done
        wait_for(lambda: fed.stage.staged_version == nxt, 120, f"v{nxt} prefetched after the check")
        receiver.ensure(nxt)
        assert fed.generate(rig.prompts[:1]).version == nxt and receiver.verify_generated() == set()
    finally:
        receiver.close()
        client.leave()
