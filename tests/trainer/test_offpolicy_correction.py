"""Off-policy correction (trainer/correction*.py, policy_loss.py): a tiny example worked by hand, and the
trainer's choice of which tokens to correct (those sampled by an older version than its own)."""

import copy
import math

import pytest
import torch

from rlsync.trainer import TorchBackend, UnknownNameError, build_policy_loss

from rl_testdata import synthetic_batch

L = math.log

# One sample, four response tokens and a masked garbage one; clip_eps 0.2, cap C = 2.
#   token   μ (old)  π_prox  π_θ     ρ = π_prox/μ   r = π_θ/π_prox   A    PPO term -min(rA, clip(r)A)
#   a       0.25     0.75    0.825   3   (> C)      1.1              +1   -1.1
#   b       0.5      0.25    0.25    0.5            1.0              -1   +1.0
#   c       0.4      0.5     0.25    1.25           0.5              +1   -0.5  (unclipped: pessimistic side)
#   d       0.2      0.2     0.3     1   (sampled by the trainer's version: not corrected)  1.5  +1   -1.2 (clipped)
# tis  weights 2, 0.5, 1.25, 1:  tokens -2.2, +0.5, -0.625, -1.2   -> mean -3.525 / 4 = -0.88125
# mask weights 0, 0.5, 1.25, 1:  tokens  0,   +0.5, -0.625, -1.2   -> mean -1.325 / 4 = -0.33125
OLD = torch.tensor([[L(0.25), L(0.5), L(0.4), L(0.2), 0.0]])
PROX = torch.tensor([[L(0.75), L(0.25), L(0.5), L(0.2), 9.0]])   # d: the trainer passes prox = old
LP = torch.tensor([[L(0.825), L(0.25), L(0.25), L(0.3), 70.0]])
ADV = torch.tensor([[1.0, -1.0, 1.0, 1.0, 4.0]])
MASK = torch.tensor([[1, 1, 1, 1, 0]])
CORRECTED = torch.tensor([[True, True, True, False, False]])


@pytest.mark.parametrize("correction, loss, grad, weight_mean", [
    # d loss / d logprob = -A r w / 4 on unclipped tokens, 0 on clipped (d) and masked ones
    ("tis", -3.525 / 4, [-1.1 * 2 / 4, 1.0 * 0.5 / 4, -0.5 * 1.25 / 4, 0.0, 0.0], (2 + 0.5 + 1.25) / 3),
    ("mask", -1.325 / 4, [0.0, 1.0 * 0.5 / 4, -0.5 * 1.25 / 4, 0.0, 0.0], (0 + 0.5 + 1.25) / 3),
])
def test_correction_arithmetic_on_a_hand_worked_example(correction, loss, grad, weight_mean):
    loss_fn = build_policy_loss("ppo_clip", clip_eps=0.2, tis_cap=2.0, correction=correction)
    lp = LP.clone().requires_grad_(True)
    got, _ = loss_fn(logprobs=lp, old_logprobs=OLD, advantages=ADV, response_mask=MASK, prox_logprobs=PROX)
    assert got.item() == pytest.approx(loss, abs=1e-6)
    got.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([grad]), atol=1e-6, rtol=0)
    w, m = loss_fn.correction(PROX, OLD, CORRECTED)
    assert m["offpolicy/clip_frac"].item() == pytest.approx(1 / 3)      # token a of a, b, c
    assert m["offpolicy/weight_mean"].item() == pytest.approx(weight_mean)
    assert w[0, 3:].tolist() == [1.0, 1.0]                               # uncorrected and masked: 1


def test_grpo_applies_the_same_correction_and_none_or_no_cap_turns_it_off():
    kw = dict(logprobs=LP, old_logprobs=OLD, advantages=ADV, response_mask=MASK, prox_logprobs=PROX)
    grpo, _ = build_policy_loss("grpo", clip_eps=0.2)(**kw)               # tis, cap 2: the defaults
    assert grpo.item() == pytest.approx(-3.525 / 4, abs=1e-6)
    for off in ({"correction": "none"}, {"tis_cap": None}):
        loss_fn = build_policy_loss("grpo", clip_eps=0.2, **off)
        assert not loss_fn.needs_prox and loss_fn.correction is None
        assert loss_fn(**kw)[0].item() == pytest.approx((-1.1 + 1.0 - 0.5 - 1.2) / 4, abs=1e-6)
    with pytest.raises(UnknownNameError, match="unknown off-policy correction 'clip'"):
        build_policy_loss("grpo", correction="clip")
    with pytest.raises(ValueError, match="correct='some': must be mixed, stale or all"):
        build_policy_loss("grpo", correct="some")


def test_the_trainer_corrects_only_tokens_sampled_by_an_older_version(tiny):
    _, model = tiny
    backend = TorchBackend(TorchBackend.Config(policy_loss="grpo"), copy.deepcopy(model))
    backend.version = 5
    batch = synthetic_batch(model, version=5)     # 8 samples, 3 response tokens each (positions 4..6)
    # The behaviour policy "differed" by e^1 on every token, as if an older version had sampled it.
    batch = batch.replace(old_logprobs=(batch.old_logprobs - 1.0) * batch.response_mask)
    on_policy = backend.prepare(batch)[1]
    assert "prox" not in on_policy and on_policy["offpolicy/corrected_token_frac"] == 0  # no extra forward
    # Samples 0-3 switched from v4 to v5 after their first response token; samples 4-7 are v5 throughout.
    tv = batch.versions_per_token().clone()
    tv[:4, 4] = 4
    mixed = batch.replace(token_versions=tv, versions=torch.tensor([4] * 4 + [5] * 4))
    _, extra = backend.prepare(mixed)
    assert extra["offpolicy/mixed_sample_frac"] == 0.5 and extra["offpolicy/spans_per_sample"] == 1.5
    assert extra["offpolicy/corrected_token_frac"] == pytest.approx(4 / 24)
    assert extra["offpolicy/clip_frac"] == 1.0 and extra["offpolicy/weight_mean"] == pytest.approx(2.0)  # e > 2
    corrected = torch.zeros_like(tv, dtype=torch.bool)
    corrected[:4, 4] = True
    # uncorrected tokens carry prox = old (ρ = 1); corrected ones the trainer's own log-probs
    torch.testing.assert_close(extra["prox"][~corrected], mixed.old_logprobs[~corrected])
    assert bool((extra["prox"][corrected] - mixed.old_logprobs[corrected] - 1.0).abs().lt(1e-5).all())
    m = backend.train_step(mixed)
    assert m["offpolicy/clip_frac"] == 1.0 and m["offpolicy/mixed_sample_frac"] == 0.5


def test_a_whole_stale_sample_is_corrected_only_with_correct_stale(tiny):
    _, model = tiny
    batch = synthetic_batch(model, version=4)      # every token one version old, no sample spans a switch
    for correct, frac in (("mixed", 0.0), ("stale", 1.0), ("all", 1.0)):
        backend = TorchBackend(TorchBackend.Config(policy_loss="grpo", policy_loss_args={"correct": correct}),
                               copy.deepcopy(model))
        backend.version = 5
        _, extra = backend.prepare(batch)
        assert extra["offpolicy/corrected_token_frac"] == frac and (("prox" in extra) == bool(frac)), correct
    fresh = synthetic_batch(model, version=5)
    assert backend.prepare(fresh)[1]["offpolicy/corrected_token_frac"] == 1.0   # all: fresh tokens too
