"""In-flight updates on the vLLM engine: a version built beside the live kernels (`VllmEngine.prepare`) is
swapped in between two decode steps; greedy tokens after the switch are those of the same version loaded
drained (and the trainer's own first tokens); a sample spanning the switch carries exactly its spans, and
with `recompute` continues exactly as the new weights continue its prefix.

The switch lands at a known step: a forward hook on vLLM's model prepares the version during forward k
(1: the prefill of every prompt), so the swap comes right after token k-1: tokens 0..k-1 are the old
version's, k.. the new one's. One engine for the module (conftest.py).
"""
import pytest
import torch

from vllm_helpers import new_version

pytestmark = pytest.mark.timeout(600)


def _specs(rig):
    return tuple((n, tuple(t.shape)) for n, t in rig.params.items())


def _prepare_during_forward(rig, version, weights, k):
    model = rig.engine.llm.collective_rpc(lambda w: w.model_runner.get_model())[0]
    calls = {"n": 0}

    def hook(mod, args, out):
        calls["n"] += 1
        if calls["n"] == k:
            assert rig.engine.prepare(iter(weights.items()), version, specs=_specs(rig), expect=list(weights))

    return model.register_forward_hook(hook)


def _greedy(rig, prompts, n):
    c = rig.engine.config
    was = (c.do_sample, c.max_new_tokens)
    c.do_sample, c.max_new_tokens = False, n
    try:
        return rig.engine.generate(prompts)
    finally:
        c.do_sample, c.max_new_tokens = was


def test_greedy_after_an_inflight_switch_equals_the_version_loaded_drained(rig):
    old = rig.engine.version
    v = old + 1
    new_version(rig.params, rig.base, seed=11)
    weights = {n: t.clone() for n, t in rig.params.items()}
    h = _prepare_during_forward(rig, v, weights, k=2)
    try:
        mixed = _greedy(rig, rig.prompts, 12)
    finally:
        h.remove()
    assert rig.engine.version == v and mixed.token_versions is not None
    sw = rig.engine.switches[-1]
    assert sw.version == v and sw.in_flight and 0 <= sw.pause_s < sw.build_s
    after = _greedy(rig, rig.prompts, 12)
    rig.engine.apply(iter(weights.items()), v, specs=_specs(rig))  # the same version, loaded drained
    drained = _greedy(rig, rig.prompts, 12)
    assert after.response_ids == drained.response_ids
    assert torch.allclose(after.logprobs, drained.logprobs, atol=1e-3)
    with torch.no_grad():  # and the trainer's fp32 model (a fresh load of v) picks the same first tokens
        for p, got in zip(rig.prompts, after.response_ids):
            assert got[0] == int(rig.model(torch.tensor([p])).logits[0, -1].argmax())
    rig.version = max(rig.version, v)  # keep the rig's trainer ahead of the engine


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_sample_spanning_a_switch_has_exactly_its_spans(rig, kv):
    n, k = 10, 4
    old = rig.engine.version
    before = _greedy(rig, rig.prompts, n)  # the old version's own greedy tokens
    v = old + 1
    new_version(rig.params, rig.base, seed=20 + (kv == "recompute"))
    weights = {name: t.clone() for name, t in rig.params.items()}
    rig.engine.config.kv_policy = kv
    h = _prepare_during_forward(rig, v, weights, k=k)
    try:
        out = _greedy(rig, rig.prompts, n)
    finally:
        h.remove()
        rig.engine.config.kv_policy = "keep"
    assert out.version == old and rig.engine.version == v
    p = out.input_ids.shape[1] - max(len(r) for r in out.response_ids)
    want = torch.full_like(out.input_ids, old)
    want[:, p + k:] = v
    m = out.response_mask.bool()
    assert torch.equal(out.token_versions[m], want[m])
    for a, b in zip(out.response_ids, before.response_ids):
        assert a[:k] == b[:k]  # before the switch: the old version's tokens
    assert torch.isfinite(out.logprobs[m]).all()
    if kv == "recompute":  # after it: exactly what the new version samples after that prefix
        live = [(pr, r) for pr, r in zip(rig.prompts, out.response_ids) if len(r) > k]  # in flight at the switch
        assert live
        cont = _greedy(rig, [pr + r[:k] for pr, r in live], n - k)
        for (_, r), c in zip(live, cont.response_ids):
            assert r[k:] == c
    rig.version = max(rig.version, v)
