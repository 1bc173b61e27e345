"""In-flight updates on the hf engine: a version offered into the spare buffers is switched in between two
decode steps; greedy tokens after the switch are a fresh engine's; a sample spanning the switch carries
exactly the spans of the switch; `recompute` continues exactly as the new weights would.

The switch is triggered at a known step by a forward hook on the test's model: forward k (1: the prefill)
gives token k-1's logits; the hook offers the version during it, so the switch lands right after token k-1
is sampled: tokens 0..k-1 are the old version's, k.. the new one's.
"""
import copy

import pytest
import torch

from rlsync.rollout import RolloutEngine


def make_engine(model, tok, n=8):
    e = RolloutEngine(RolloutEngine.Config(max_new_tokens=n, do_sample=False), copy.deepcopy(model),
                      pad_token_id=tok.pad_token_id, eos_token_id=-1)  # no end token: every response is n long
    e.version = 1
    return e


def other_weights(model, seed=5):
    g = torch.Generator().manual_seed(seed)
    return {n: p.data + 0.5 * p.data.std() * torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}


def offer_at(engine, weights, version, k):
    """Offer `version` during the k-th forward of the next generate (k = 1: the prefill)."""
    calls = {"n": 0}

    def hook(mod, args, out):
        calls["n"] += 1
        if calls["n"] == k:
            for n, t in engine.next_buffers().items():
                t.copy_(weights[n])
            engine.offer_next(version)

    return engine.model.register_forward_hook(hook)


def fresh(model, tok, weights, n=8):
    e = make_engine(model, tok, n)
    e.load_state(weights, version=2)
    return e


def test_greedy_after_switch_equals_a_fresh_engine(tiny):
    task, model = tiny
    tok = task.tokenizer
    new = other_weights(model)
    prompts = [p.prompt_ids for p in task.next_prompts(4)]
    e = make_engine(model, tok)
    e.start_inflight("keep")
    h = offer_at(e, new, 2, k=3)
    mixed = e.generate(prompts)
    h.remove()
    assert e.version == 2 and mixed.token_versions is not None
    after = e.generate(prompts)  # every token of this call under v2
    assert after.version == 2 and after.token_versions is None
    ref = fresh(model, tok, new).generate(prompts)
    assert after.response_ids == ref.response_ids
    assert torch.allclose(after.logprobs, ref.logprobs, atol=1e-5)


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_sample_spanning_a_switch_has_exactly_its_spans(tiny, kv):
    task, model = tiny
    tok = task.tokenizer
    new, k, n = other_weights(model), 3, 8
    prompts = [p.prompt_ids for p in task.next_prompts(3)]
    e = make_engine(model, tok, n)
    e.start_inflight(kv)
    h = offer_at(e, new, 2, k=k)
    out = e.generate(prompts)
    h.remove()
    p = out.input_ids.shape[1] - n
    # spans: tokens 0..k-1 sampled by v1, k.. by v2; the prompt's positions carry the sample's version (v1)
    want = torch.full_like(out.input_ids, 1)
    want[:, p + k:] = 2
    assert torch.equal(out.token_versions, want)
    sw = e.take_switches()
    assert [s.version for s in sw] == [2] and sw[0].in_flight and sw[0].pause_s >= 0
    old = make_engine(model, tok, n).generate(prompts)
    for a, b in zip(out.response_ids, old.response_ids):
        assert a[:k] == b[:k]  # before the switch: v1's greedy tokens
    if kv == "recompute":  # after it: exactly v2's greedy continuation of the prefix
        for i, (pr, r) in enumerate(zip(prompts, out.response_ids)):
            cont = fresh(model, tok, new, n - k).generate([pr + r[:k]])
            assert r[k:] == cont.response_ids[0], i
    # each token's log-prob is the one of the weights that sampled it: v1's before the switch
    m = out.response_mask.bool() & (out.token_versions == 1)
    assert torch.allclose(out.logprobs[m], old.logprobs[m], atol=1e-4)
    assert torch.isfinite(out.logprobs).all()


def test_spare_buffers_never_alias_the_live_weights(tiny):
    task, model = tiny
    e = make_engine(model, task.tokenizer)
    e.start_inflight("keep")
    live = {n: t.data_ptr() for n, t in e.named_parameters_for_sync().items()}
    spare = e.next_buffers()
    assert all(spare[n].data_ptr() != ptr for n, ptr in live.items())
    for t in spare.values():
        t.zero_()
    e.offer_next(3)
    assert e.switch_prepared().version == 3 and e.version == 3
    # the old live tensors are the spare now; the live ones are what was offered
    assert {n: t.data_ptr() for n, t in e.next_buffers().items()} == live
    assert all((t == 0).all() for t in e.named_parameters_for_sync().values())
    e.offer_next(2)  # older than what it holds: never switched in
    assert e.switch_prepared() is None and e.version == 3
