"""`token_logprobs(..., start=)`: logits only where log-probs are used, the same values there.

The trainer and the rollout's re-score need log-probs at response positions only; the prompt's
[B, T, vocab] logits were most of a step's memory with a 49,152-entry vocabulary.
"""

import copy

import pytest
import torch

from rlsync.core.logprobs import response_start
from rlsync.rollout import RolloutEngine
from rlsync.trainer import TorchBackend, token_logprobs

from rl_testdata import TinyLM, synthetic_batch


def left_padded(vocab: int, lengths=(7, 4, 9, 2), resp: int = 3, seed: int = 0):
    """Rows of different prompt lengths, left-padded to the widest, then `resp` response tokens."""
    g = torch.Generator().manual_seed(seed)
    p = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), p + resp), generator=g)
    attn = torch.ones_like(ids)
    for i, n in enumerate(lengths):
        attn[i, : p - n] = 0
        ids[i, : p - n] = 0
    return ids, attn, p


def keeps_recorded(model: torch.nn.Module) -> list:
    """The `logits_to_keep` of every forward call of `model` (None: not passed), appended as they happen."""
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("logits_to_keep")), with_kwargs=True)
    return seen


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_start_gives_the_full_computation_at_the_positions_used(tiny, temperature):
    _, model = tiny
    ids, attn, p = left_padded(model.config.vocab_size)
    with torch.no_grad():
        full_lp, full_ent = token_logprobs(model, ids, attn, temperature=temperature, with_entropy=True)
        for start in (1, p - 3, p, ids.shape[1] - 1):
            lp, ent = token_logprobs(model, ids, attn, temperature=temperature, with_entropy=True, start=start)
            assert lp.shape == ent.shape == ids.shape
            assert (lp[:, start:] - full_lp[:, start:]).abs().max().item() <= 1e-6
            assert (ent[:, start:] - full_ent[:, start:]).abs().max().item() <= 1e-6
            assert (lp[:, :start] == 0).all() and (ent[:, :start] == 0).all()
        none, _ = token_logprobs(model, ids, attn, start=ids.shape[1])  # nothing to score: all 0, no error
        assert none.shape == ids.shape and (none == 0).all()
    with pytest.raises(ValueError, match="start must be within"):
        token_logprobs(model, ids, attn, start=0)


def test_start_reaches_the_lm_head_through_peft(tiny):
    """A LoRA policy (peft) passes `logits_to_keep` on to the HF model: same values, fewer logits."""
    pytest.importorskip("peft")
    from rlsync.core.lora import LoraConfig, apply_lora

    _, model = tiny
    peft_model = apply_lora(copy.deepcopy(model), LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    ids, attn, p = left_padded(model.config.vocab_size, seed=1)
    out_sizes = []
    peft_model.get_base_model().lm_head.register_forward_hook(lambda m, a, out: out_sizes.append(out.shape[1]))
    with torch.no_grad():
        full, _ = token_logprobs(peft_model, ids, attn)
        part, _ = token_logprobs(peft_model, ids, attn, start=p)
    assert out_sizes == [ids.shape[1], ids.shape[1] - p + 1]
    assert (part[:, p:] - full[:, p:]).abs().max().item() <= 1e-6


def test_response_start_is_the_first_response_column():
    mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]])
    assert response_start(mask) == 2
    assert response_start(torch.zeros(2, 5)) == 1  # no response: every position
    assert response_start(torch.tensor([[1, 1, 0]])) == 1  # position 0 has no log-prob


def test_trainer_scores_only_response_positions():
    """Every trainer forward (policy, and prox with several mini-batches) asks for the response's logits only."""
    model = TinyLM()
    batch = synthetic_batch(model, prompt_len=5, resp_len=3)
    backend = TorchBackend(TorchBackend.Config(num_mini_batches=2), model)
    seen = keeps_recorded(model)
    metrics = backend.train_step(batch)
    assert seen == [4, 4, 4]  # prox over the batch, then one per mini-batch: positions 4..7 predict tokens 5..7
    assert metrics["logprob_gap"] < 1e-6  # the behaviour log-probs (full computation) agree at the response


def test_rollout_rescore_scores_only_response_positions(tiny):
    task, model = tiny
    tok = task.tokenizer
    engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=4), copy.deepcopy(model), pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)
    prompts = [p.prompt_ids for p in task.next_prompts(3)]
    prompts[1] = prompts[1][:2]  # left padding
    seen = keeps_recorded(engine.model)
    torch.manual_seed(0)
    out = engine.generate(prompts)
    p = max(len(x) for x in prompts)
    assert seen[-1] == out.input_ids.shape[1] - p + 1  # the re-score: response positions only
    with torch.no_grad():
        full, _ = token_logprobs(model, out.input_ids, out.attention_mask)
    m = out.response_mask.bool()
    assert (full[m] - out.logprobs[m]).abs().max().item() <= 1e-6
