"""Policy and value losses against hand-computed values (see each loss file's docstring)."""

import math

import pytest
import torch

from rlsync.trainer import build_policy_loss, get_policy_loss
from rlsync.trainer.loss_value import build_value_loss

L = math.log

# Row 0: ratio 1.5 (A+1, clipped), 0.5 (A+1, not clipped), 1.0, then a masked garbage token.
# Row 1: ratio 0.5 with A-1 (clipped), then masked.
OLD = torch.zeros(2, 4)
LP = torch.tensor([[L(1.5), L(0.5), 0.0, 100.0], [L(0.5), 50.0, -50.0, 7.0]])
ADV = torch.tensor([[1.0, 1.0, -1.0, 5.0], [-1.0, 3.0, 3.0, 3.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


def test_ppo_clip_matches_hand_computation_and_ignores_masked_tokens():
    lp = LP.clone().requires_grad_(True)
    loss, m = build_policy_loss("ppo_clip", clip_eps=0.2)(logprobs=lp, old_logprobs=OLD, advantages=ADV,
                                                           response_mask=MASK)
    # per-token: -1.2, -0.5, +1.0, (masked), +0.8  -> token mean over 4 tokens
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 1.0 + 0.8) / 4, abs=1e-6)
    assert m["clip_frac"] == pytest.approx(0.5)
    loss.backward()
    # clipped tokens get no gradient; unclipped: -A * ratio / n_tokens; masked: exactly 0, never nan
    expected = torch.tensor([[0.0, -0.5 / 4, 1.0 / 4, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(lp.grad, expected, atol=1e-6, rtol=0)


def test_seq_mean_token_mean_aggregation():
    loss, _ = build_policy_loss("ppo_clip", loss_agg="seq_mean_token_mean")(
        logprobs=LP, old_logprobs=OLD, advantages=ADV, response_mask=MASK)
    assert loss.item() == pytest.approx(((-1.2 - 0.5 + 1.0) / 3 + 0.8) / 2, abs=1e-6)


def test_asymmetric_clip_high():
    # ratio 1.5, A+1 with clip_eps_high 0.28 -> -1.28
    loss, _ = build_policy_loss("ppo_clip", clip_eps=0.2, clip_eps_high=0.28)(
        logprobs=torch.tensor([[L(1.5)]]), old_logprobs=torch.zeros(1, 1), advantages=torch.ones(1, 1),
        response_mask=torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.28, abs=1e-6)


def test_truncated_importance_sampling_weights_stale_tokens():
    # current == proximal (ratio 1); proximal/behaviour = 3 (capped to 2) and 0.5.
    prox = torch.zeros(1, 2)
    old = torch.tensor([[-L(3.0), L(2.0)]])
    loss_fn = build_policy_loss("ppo_clip", tis_cap=2.0)
    assert loss_fn.needs_prox
    loss, _ = loss_fn(logprobs=prox.clone(), old_logprobs=old, advantages=torch.ones(1, 2),
                      response_mask=torch.ones(1, 2), prox_logprobs=prox)
    assert loss.item() == pytest.approx(-(2.0 + 0.5) / 2, abs=1e-6)
    _, m = loss_fn.correction(prox, old, torch.ones(1, 2))
    assert m["offpolicy/clip_frac"] == pytest.approx(0.5)
    assert m["offpolicy/weight_mean"] == pytest.approx(1.25, abs=1e-6)
    # without proximal log-probs (no token to correct) the loss is plain PPO against the behaviour policy
    plain, _ = loss_fn(logprobs=prox.clone(), old_logprobs=old, advantages=torch.ones(1, 2),
                       response_mask=torch.ones(1, 2))
    assert plain.item() == pytest.approx(-(1.2 + 0.5) / 2, abs=1e-6)   # ratios 3 (clipped to 1.2) and 0.5


def test_grpo_k3_kl_penalty():
    lp = torch.zeros(1, 2)
    ref = torch.tensor([[L(0.5), 0.0]])
    loss_fn = build_policy_loss("grpo", kl_coef=0.1)
    assert loss_fn.needs_ref
    loss, m = loss_fn(logprobs=lp, old_logprobs=lp, advantages=torch.zeros(1, 2),
                      response_mask=torch.tensor([[1, 0]]), ref_logprobs=ref)
    k3 = 0.5 - L(0.5) - 1.0  # ≈ 0.1931
    assert m["kl"] == pytest.approx(k3, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * k3, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_fn(logprobs=lp, old_logprobs=lp, advantages=torch.zeros(1, 2), response_mask=torch.ones(1, 2))
    assert not build_policy_loss("grpo").needs_ref


def test_grpo_without_kl_equals_ppo_clip():
    a, _ = build_policy_loss("grpo")(logprobs=LP, old_logprobs=OLD, advantages=ADV, response_mask=MASK)
    b, _ = get_policy_loss("ppo_clip")()(logprobs=LP, old_logprobs=OLD, advantages=ADV, response_mask=MASK)
    assert a.item() == pytest.approx(b.item())


def test_entropy_bonus():
    loss, m = build_policy_loss("ppo_clip", entropy_coef=0.1)(
        logprobs=torch.zeros(1, 1), old_logprobs=torch.zeros(1, 1), advantages=torch.zeros(1, 1),
        response_mask=torch.ones(1, 1), entropy=torch.full((1, 1), 2.0))
    assert m["entropy"] == pytest.approx(2.0)
    assert loss.item() == pytest.approx(-0.2)


def test_clipped_value_loss():
    vl = build_value_loss(clip=0.5)
    values = torch.tensor([[2.0, 0.1, 9.0]])
    loss, m = vl(values=values, old_values=torch.zeros(1, 3), returns=torch.ones(1, 3),
                 response_mask=torch.tensor([[1, 1, 0]]))
    # token 0: max((2-1)^2, (0.5-1)^2) = 1; token 1: (0.1-1)^2 = 0.81 (inside the clip)
    assert loss.item() == pytest.approx(0.5 * (1.0 + 0.81) / 2, abs=1e-6)
    assert m["vf_clip_frac"] == pytest.approx(0.0)
    # values moved far the wrong way: the clipped error is larger and wins
    loss, m = vl(values=torch.tensor([[1.2]]), old_values=torch.tensor([[3.0]]), returns=torch.tensor([[1.0]]),
                 response_mask=torch.ones(1, 1))
    assert loss.item() == pytest.approx(0.5 * (2.5 - 1.0) ** 2, abs=1e-6)
    assert m["vf_clip_frac"] == 1.0
