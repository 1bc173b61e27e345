"""Advantage estimators against hand-computed values, and the registries."""

import pytest
import torch

from rlsync.trainer import UnknownNameError, build_adv_est, get_adv_est, get_policy_loss, register_adv_est
from rlsync.trainer.advantage import AdvantageEstimator
from rlsync.trainer.registry import DuplicateNameError, Registry

MASK = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1]])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
GROUPS = torch.tensor([7, 7, 7, 7, 3, 3])


def test_grpo_group_normalised_and_broadcast_to_response_tokens():
    adv, ret = build_adv_est("grpo")(rewards=REWARDS, response_mask=MASK, group_ids=GROUPS)
    assert ret is None
    s = 0.5 / (1 / 3) ** 0.5  # centred ±0.5 over the unbiased std 0.577 -> ±0.866
    expected = torch.tensor([[0, s, s], [0, -s, 0], [0, -s, -s], [0, s, s], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_without_std_normalisation():
    adv, _ = build_adv_est("grpo", norm_by_std=False)(rewards=REWARDS, response_mask=MASK, group_ids=GROUPS)
    torch.testing.assert_close(adv[:, 1], torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]))


def test_grpo_needs_groups():
    with pytest.raises(ValueError, match="group_ids"):
        build_adv_est("grpo")(rewards=REWARDS, response_mask=MASK)


def test_rloo_leave_one_out_baseline():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.7])
    g = torch.tensor([0, 0, 0, 0, 1])
    adv, _ = build_adv_est("rloo")(rewards=r, response_mask=torch.ones(5, 1), group_ids=g)
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.7]))


def test_gae_hand_computed():
    values = torch.tensor([[9.0, 0.5, 0.4, 0.3]])  # position 0 is prompt: its value is ignored
    mask = torch.tensor([[0, 1, 1, 1]])
    est = build_adv_est("gae", gamma=0.9, lam=0.5, whiten=False)
    adv, ret = est(rewards=torch.tensor([1.0]), response_mask=mask, values=values)
    a3 = 1.0 - 0.3
    a2 = 0.9 * 0.3 - 0.4 + 0.45 * a3
    a1 = 0.9 * 0.4 - 0.5 + 0.45 * a2
    torch.testing.assert_close(adv, torch.tensor([[0.0, a1, a2, a3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, a1 + 0.5, a2 + 0.4, a3 + 0.3]]))


def test_gae_monte_carlo_limit_and_whitening():
    # gamma = lam = 1: A_t = R - V_t, returns = R on every response token.
    values = torch.tensor([[0.0, 0.5, 0.4, 0.3], [0.0, 0.2, 0.0, 0.0]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]])
    adv, ret = build_adv_est("gae", gamma=1.0, lam=1.0, whiten=False)(
        rewards=torch.tensor([1.0, -1.0]), response_mask=mask, values=values)
    torch.testing.assert_close(adv, torch.tensor([[0, 0.5, 0.6, 0.7], [0, -1.2, 0, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, 1, 1, 1], [0, -1, 0, 0]]))
    w, _ = build_adv_est("gae", gamma=1.0, lam=1.0)(rewards=torch.tensor([1.0, -1.0]), response_mask=mask,
                                                    values=values)
    sel = w[mask.bool()]
    assert abs(sel.mean().item()) < 1e-6 and sel.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-3)
    assert (w[~mask.bool()] == 0).all()


def test_registry_errors_list_known_names():
    with pytest.raises(UnknownNameError) as e:
        get_adv_est("ppo")
    assert isinstance(e.value, KeyError)
    assert "gae, grpo, rloo" in str(e.value) and "'ppo'" in str(e.value)
    with pytest.raises(KeyError, match="grpo, ppo_clip"):
        get_policy_loss("dapo")


def test_adding_an_estimator_is_one_registration():
    r = Registry("thing")

    @r.register("x")
    class X:
        pass

    assert r.get("x") is X and "x" in r
    with pytest.raises(DuplicateNameError):
        r.register("x")(int)

    @register_adv_est("test_constant")
    class Constant(AdvantageEstimator):
        def __call__(self, *, rewards, response_mask, group_ids=None, values=None):
            return response_mask.float(), None

    adv, _ = build_adv_est("test_constant")(rewards=REWARDS, response_mask=MASK)
    assert adv.sum().item() == MASK.sum().item()
