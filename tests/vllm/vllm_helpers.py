"""Helpers of the vLLM tests (a module of its own: every test folder has a `conftest`)."""


def bf16_exact(t):
    """`t` rounded to bf16 and back: weights the trainer (fp32) and vLLM (bf16) hold identically."""
    import torch

    return t.to(torch.bfloat16).to(t.dtype)


def new_version(params, base, seed: int, scale: float = 0.002):
    """Write a version into `params` (bf16-exact): every tensor base * (1 + scale * noise), and the
    final norm scaled by a factor that depends on the seed, so consecutive versions predict clearly
    different distributions while the model stays sane (its bf16 rounding error stays small)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in params.items():
            w = base[name] * (1 + scale * torch.randn(p.shape, generator=g))
            if name == "model.norm.weight":
                w = w * (0.6 + 0.1 * (seed % 8))
            p.copy_(bf16_exact(w))


def logprob_gap(model, rollout):
    """Mean |trainer log-prob - vLLM log-prob| over response tokens (the trainer recomputes in fp32)."""
    import torch

    from rlsync.core.logprobs import token_logprobs

    with torch.no_grad():
        lp, _ = token_logprobs(model, rollout.input_ids, rollout.attention_mask)
    m = rollout.response_mask.bool()
    return (lp - rollout.logprobs)[m].abs().mean().item()
