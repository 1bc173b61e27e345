"""Token log-probs (and entropy) of a causal LM: the one function trainer and rollout both call.

The importance ratio π_θ/π_behaviour is only 1 for an unchanged policy if both sides compute
log-probs the same way: same temperature, same position ids under left padding, same alignment.
So the rollout engine does not use `generate`'s scores; it re-scores the sampled sequence with this
function, and the trainer calls it again on the same tensors:

    lp, ent = token_logprobs(model, input_ids, attention_mask, temperature=1.0)
    lp[:, t] == log p(input_ids[:, t] | input_ids[:, :t])   # lp[:, 0] == 0, aligned to input_ids

Simplifies: top-p/top-k truncation during sampling is ignored (the log-prob is of the
temperature-scaled full distribution, as in verl and OpenRLHF).
"""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens of each row; padding gets 0 (what HF `generate` uses)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, T] of `input_ids` under `model`, aligned to `input_ids`.

    Returns (logprobs, entropy); entropy is [B, T] (entropy of the distribution that predicted
    token t) when `with_entropy`, else None. Position 0 of both is 0: nothing predicts it.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    picked = torch.gather(logits, -1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    lp = torch.nn.functional.pad(picked - logz, (1, 0))
    ent = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        ent = torch.nn.functional.pad(logz - (probs * logits).sum(-1), (1, 0))
    return lp, ent


def critic_values(critic: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Critic values [B, T] aligned like the log-probs: values[:, t] is V(state before token t),
    read from the critic's output at position t-1 (values[:, 0] == 0).

    `critic` is any module mapping (input_ids, attention_mask, position_ids) to [B, T] (`ValueModel`).
    """
    v = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask))
    return torch.nn.functional.pad(v[:, :-1].float(), (1, 0))
