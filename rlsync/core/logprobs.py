"""Token log-probs (and entropy) of a causal LM: the one function trainer and rollout both call.

The importance ratio π_θ/π_behaviour is only 1 for an unchanged policy if both sides compute
log-probs the same way: same temperature, same position ids under left padding, same alignment.
So the rollout engine does not use `generate`'s scores; it re-scores the sampled sequence with this
function, and the trainer calls it again on the same tensors:

    lp, ent = token_logprobs(model, input_ids, attention_mask, temperature=1.0)
    lp[:, t] == log p(input_ids[:, t] | input_ids[:, :t])   # lp[:, 0] == 0, aligned to input_ids

Only the response's positions need log-probs: `start=response_start(response_mask)` slices the hidden states
before the LM head (HF's `logits_to_keep`), so the [B, T, vocab] logits are never made for the prompt (with a
49,152-entry vocabulary they were most of a step's memory); lp[:, t] for t >= start is unchanged, earlier is 0.

Simplifies: top-p/top-k truncation during sampling is ignored (the log-prob is of the
temperature-scaled full distribution, as in verl and OpenRLHF).
"""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over the real tokens of each row; padding gets 0 (what HF `generate` uses)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def response_start(response_mask: torch.Tensor) -> int:
    """The first column holding a response token in any row (1 when there is none: every position).

    Rows share their prompt width (left padding) in a rollout; a batch of several (right-padded) has the
    narrowest one's: `token_logprobs(..., start=response_start(mask))` covers every response token.
    """
    cols = response_mask.bool().any(0).nonzero()
    return max(1, int(cols[0])) if len(cols) else 1


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    start: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, T] of `input_ids` under `model`, aligned to `input_ids`.

    Returns (logprobs, entropy); entropy is [B, T] (entropy of the distribution that predicted
    token t) when `with_entropy`, else None. Position 0 of both is 0: nothing predicts it.
    `start` (1 <= start <= T): compute only positions t >= start; both are 0 before it. With start > 1
    `model` must take HF's `logits_to_keep` keyword (every transformers causal LM, peft, DDP and DeepSpeed
    wrappers pass it on).
    """
    t = input_ids.shape[1]
    if not 1 <= start <= t:
        raise ValueError(f"start must be within 1..{t} (the sequence length), got {start}")
    # Logits at positions start-1 .. T-2 predict tokens start .. T-1; HF keeps the last `logits_to_keep`.
    keep = {} if start == 1 else {"logits_to_keep": t - start + 1}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
        **keep,
    )
    logits = out.logits[:, start - 1 - t:-1, :].float()  # also right for a model that kept every position
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    picked = torch.gather(logits, -1, input_ids[:, start:].unsqueeze(-1)).squeeze(-1)
    lp = torch.nn.functional.pad(picked - logz, (start, 0))
    ent = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        ent = torch.nn.functional.pad(logz - (probs * logits).sum(-1), (start, 0))
    return lp, ent


def critic_values(critic: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Critic values [B, T] aligned like the log-probs: values[:, t] is V(state before token t),
    read from the critic's output at position t-1 (values[:, 0] == 0).

    `critic` is any module mapping (input_ids, attention_mask, position_ids) to [B, T] (`ValueModel`).
    """
    v = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask))
    return torch.nn.functional.pad(v[:, :-1].float(), (1, 0))
