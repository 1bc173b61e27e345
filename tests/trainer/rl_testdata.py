"""Shared test data: an on-policy batch for a tiny model, without the rollout engine."""

import torch

from rlsync.trainer import Batch, token_logprobs


def synthetic_batch(model, *, n=8, group=4, prompt_len=4, resp_len=3, vocab=16, seed=0, version=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (n, prompt_len + resp_len), generator=g)
    attn = torch.ones_like(ids)
    resp = torch.zeros_like(ids)
    resp[:, prompt_len:] = 1
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, attn)
    return Batch(input_ids=ids, attention_mask=attn, response_mask=resp, old_logprobs=lp * resp,
                 rewards=torch.rand(n, generator=g), versions=torch.full((n,), version),
                 group_ids=torch.arange(n) // group)


class TinyLM(torch.nn.Module):
    """A transformers-free causal LM (embedding -> causal mean of the prefix -> head), cheap to import
    in subprocesses; it speaks the keyword interface `token_logprobs` calls."""

    def __init__(self, vocab=16, hidden=32, seed=0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.embed = torch.nn.Embedding(vocab, hidden)
            self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, *, input_ids, attention_mask, position_ids=None, use_cache=False, logits_to_keep=0):
        h = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        h = h.cumsum(1) / attention_mask.cumsum(1).clamp(min=1).unsqueeze(-1)
        return type("Out", (), {"logits": self.head(torch.tanh(h[:, -logits_to_keep:]))})
