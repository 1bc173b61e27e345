"""Rollout engine: sampled log-probs agree with the trainer's; weights go in and out by name."""

import copy

import pytest
import torch

from rlsync.rollout import RolloutEngine, WeightMismatchError
from rlsync.trainer import TorchBackend, token_logprobs


def make_engine(model, tok, **cfg):
    return RolloutEngine(RolloutEngine.Config(**cfg), copy.deepcopy(model), pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)


def varied_prompts(task):
    # Prompts of different lengths, so the batch is left-padded.
    ps = [p.prompt_ids for p in task.next_prompts(6)]
    return [ps[0], ps[1][:2], ps[2], ps[3][:3], ps[4], ps[5][:1]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_unchanged_policy_has_importance_ratio_one(tiny, temperature):
    task, model = tiny
    tok = task.tokenizer
    torch.manual_seed(1)
    engine = make_engine(model, tok, temperature=temperature, max_new_tokens=6)
    out = engine.generate(varied_prompts(task))
    assert out.response_mask.sum() > 0
    # Trainer side: its own copy of the weights, loaded through the sync interface, and the batch
    # scored in two halves (a different batch composition than the engine's).
    backend = TorchBackend(TorchBackend.Config(temperature=temperature), copy.deepcopy(model))
    for n, t in backend.named_parameters_for_sync().items():
        t.copy_(engine.named_parameters_for_sync()[n])
    m = out.response_mask.bool()
    with torch.no_grad():
        halves = [token_logprobs(backend.policy, out.input_ids[s], out.attention_mask[s], temperature=temperature)[0]
                  for s in (slice(0, 3), slice(3, 6))]
    lp = torch.cat(halves)
    assert (lp - out.logprobs)[m].abs().max().item() < 1e-5
    assert (out.logprobs[~m] == 0).all()
    # Each sample scored alone without any padding gives the same log-probs (positions are right).
    for i in range(len(out.response_ids)):
        row = out.input_ids[i][out.attention_mask[i].bool()].unsqueeze(0)
        alone, _ = token_logprobs(model, row, torch.ones_like(row), temperature=temperature)
        assert (alone[0, -len(out.response_ids[i]):] - out.logprobs[i][m[i]]).abs().max().item() < 1e-5


def test_logprobs_match_what_generate_sampled_from(tiny):
    """The re-scored log-probs equal log_softmax(raw logits / T) of generate's own (KV-cached) pass."""
    task, model = tiny
    tok = task.tokenizer
    torch.manual_seed(2)
    engine = make_engine(model, tok, temperature=0.8, max_new_tokens=4)
    prompts = [p.prompt_ids for p in task.next_prompts(4)]  # equal lengths: no padding
    ids = torch.tensor(prompts)
    g = engine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), output_logits=True,
                              return_dict_in_generate=True, generation_config=engine._generation_config())
    seq = g.sequences
    logits = torch.stack(g.logits, 1).float() / 0.8  # [B, L, V], raw logits of each generated step
    gen_lp = torch.log_softmax(logits, -1).gather(-1, seq[:, ids.shape[1]:].unsqueeze(-1)).squeeze(-1)
    lp, _ = token_logprobs(engine.model, seq, torch.ones_like(seq), temperature=0.8)
    assert (lp[:, ids.shape[1]:] - gen_lp).abs().max().item() < 1e-4


def test_response_mask_stops_at_eos_and_rollout_becomes_a_batch(tiny):
    task, model = tiny
    tok = task.tokenizer
    engine = make_engine(model, tok, max_new_tokens=5)
    # Force <eos> as the second response token by biasing the output layer, then check the masks.
    with torch.no_grad():
        engine.model.lm_head.weight.zero_()
        engine.model.lm_head.weight[tok.eos_token_id] = 0.0
    torch.manual_seed(0)
    out = engine.generate([[1, 4, 5, 3]] * 64)
    for r, m in zip(out.response_ids, out.response_mask):
        eos = [i for i, t in enumerate(r) if t == tok.eos_token_id]
        assert not eos or eos[0] == len(r) - 1, "nothing after the first <eos> is part of the response"
        assert int(m.sum()) == len(r)
    assert any(len(r) < 5 for r in out.response_ids)  # uniform sampling over 16 tokens hits <eos>
    engine.version = 3
    batch = engine.generate([[1, 4, 5, 3]] * 2).to_batch(torch.tensor([0.5, 1.0]), torch.tensor([0, 0]))
    assert batch.versions.tolist() == [3, 3] and batch.old_logprobs.shape == batch.input_ids.shape


def test_named_parameters_for_sync_are_live_and_load_state_is_all_or_nothing(tiny):
    task, model = tiny
    tok = task.tokenizer
    engine = make_engine(model, tok)
    live = engine.named_parameters_for_sync()
    name = "model.embed_tokens.weight"
    assert live[name].data_ptr() == dict(engine.model.named_parameters())[name].data_ptr()  # no copy
    live[name][0, 0] = 123.0
    assert dict(engine.model.named_parameters())[name][0, 0].item() == 123.0
    # trainer names == engine names
    assert set(live) == set(TorchBackend(TorchBackend.Config(), copy.deepcopy(model)).named_parameters_for_sync())

    new = {n: torch.full_like(t, 0.25) for n, t in live.items()}
    bad = dict(new)
    bad["lm_head.weight"] = torch.zeros(3, 3)
    before = {n: t.clone() for n, t in live.items()}
    with pytest.raises(WeightMismatchError, match="lm_head.weight"):
        engine.load_state(bad)
    with pytest.raises(WeightMismatchError, match="missing"):
        engine.load_state({n: t for n, t in new.items() if n != name})
    assert all(torch.equal(before[n], t) for n, t in live.items()), "a failed load changed no weight"
    engine.load_state(new, version=5)
    assert engine.version == 5 and all((t == 0.25).all() for t in live.values())


def test_a_grpo_group_prefills_each_distinct_prompt_once(tiny):
    """Prompts in runs of g identical ones (a GRPO group): the prompt is computed once per distinct prompt, its KV
    cache repeated g times; each sample's tokens and log-probs are what the prompt alone gives."""
    task, model = tiny
    tok = task.tokenizer
    engine = make_engine(model, tok, max_new_tokens=5, do_sample=False)
    ps = [p.prompt_ids for p in task.next_prompts(2)]
    prompts = [ps[0]] * 4 + [ps[1][:3]] * 4  # two groups of 4, left-padded
    seen = []
    hook = engine.model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    try:
        out = engine.generate(prompts)
    finally:
        hook.remove()
    p = max(len(x) for x in prompts)
    assert seen[0] == (2, p - 1) and seen[1] == (8, 1)  # the groups' prompts once, then each sample's last token
    for i, x in enumerate(prompts):
        alone = engine.generate([x])
        assert alone.response_ids[0] == out.response_ids[i]
        assert torch.allclose(alone.logprobs[0][alone.response_mask[0].bool()],
                              out.logprobs[i][out.response_mask[i].bool()], atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_frozen_engine_head_never_copies_its_weight(dtype):
    # HF hands the LM head a strided view of the kept positions; on a frozen model torch's matmul then took the
    # bmm path, which in bf16 copied the whole transposed head weight at every forward (half a SmolLM2 prefill).
    from torch.profiler import ProfilerActivity, profile

    from rlsync.rollout import TinyModelConfig, build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(TinyModelConfig(tie_word_embeddings=True), vocab_size=96).to(dtype)
    engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=1), model.requires_grad_(False), pad_token_id=0,
                           eos_token_id=1)
    head = engine.model.get_output_embeddings().weight
    ids = torch.tensor([[3, 9, 4, 12, 7, 5]])
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        kept = engine.model(ids, logits_to_keep=1).logits
    copied = [e.input_shapes for e in prof.events() if e.name == "aten::copy_"
              and any(s and torch.Size(s).numel() == head.numel() for s in e.input_shapes)]
    assert copied == []
    full = engine.model(ids).logits
    assert kept.shape == (1, 1, 96) and torch.allclose(kept[0, -1].float(), full[0, -1].float(), atol=1e-2)
