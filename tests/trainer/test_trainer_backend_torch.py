"""Plain-torch trainer backend: a step's metrics, live sync tensors, PPO, checkpoint/resume, DDP."""

import copy
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlsync.trainer import Batch, BatchError, DistConfig, OptimizerConfig, TorchBackend, free_port

from rl_testdata import TinyLM, synthetic_batch


def test_grpo_step_updates_live_tensors_and_reports_metrics(tiny):
    _, model = tiny
    backend = TorchBackend(TorchBackend.Config(optimizer=OptimizerConfig(lr=1e-2), grad_clip=0.5),
                           copy.deepcopy(model))
    sync = backend.named_parameters_for_sync()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert sync[name].data_ptr() == dict(backend.model.named_parameters())[name].data_ptr()
    before = sync[name].clone()
    m = backend.train_step(synthetic_batch(model))
    for k in ("loss", "entropy", "clip_frac", "grad_norm", "approx_kl", "reward_mean", "staleness_max"):
        assert k in m and math.isfinite(m[k]), k
    assert m["grad_norm"] > 0.5  # reported before clipping
    assert m["approx_kl"] < 1e-10 and m["clip_frac"] == 0.0  # on-policy first step: ratio 1
    assert 0 < m["entropy"] <= math.log(16) + 1e-4
    assert backend.version == 1
    assert not torch.equal(before, sync[name]), "the tensors handed to the hub are the live weights"


def test_logprob_gap_compares_fresh_samples_only(tiny):
    """`logprob_gap`: mean |trainer - rollout| log-prob over response tokens of samples the trainer's
    current weights generated; stale samples (another policy) are left out, NaN when there are none."""
    _, model = tiny
    backend = TorchBackend(TorchBackend.Config(), copy.deepcopy(model))
    batch = synthetic_batch(model)                     # old_logprobs: this model's own, version 0
    assert backend.train_step(batch)["logprob_gap"] < 1e-5
    backend = TorchBackend(TorchBackend.Config(), copy.deepcopy(model))
    shifted = batch.replace(old_logprobs=(batch.old_logprobs - 0.25) * batch.response_mask)
    assert backend.train_step(shifted)["logprob_gap"] == pytest.approx(0.25, abs=1e-5)
    backend.version = 4
    assert math.isnan(backend.train_step(synthetic_batch(model, version=2))["logprob_gap"])


def test_batch_validation():
    with pytest.raises(BatchError, match="response_mask"):
        Batch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3),
              response_mask=torch.ones(2, 4), old_logprobs=torch.zeros(2, 3), rewards=torch.zeros(2),
              versions=torch.zeros(2))
    with pytest.raises(BatchError, match="rewards"):
        Batch(input_ids=torch.zeros(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 3),
              response_mask=torch.ones(2, 3), old_logprobs=torch.zeros(2, 3), rewards=torch.zeros(2, 5),
              versions=torch.zeros(2))


def test_staleness_metrics_and_truncated_is(tiny):
    _, model = tiny
    backend = TorchBackend(TorchBackend.Config(policy_loss="grpo", policy_loss_args={"tis_cap": 2.0, "correct": "stale"}),
                           copy.deepcopy(model))
    backend.version = 5
    batch = synthetic_batch(model, version=3)
    # Pretend the behaviour policy differed: shift its log-probs so π_prox/π_behaviour = e^1 on all tokens.
    batch = batch.replace(old_logprobs=(batch.old_logprobs - 1.0) * batch.response_mask,
                          rewards=torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1]))  # group 0 has no reward spread
    m = backend.train_step(batch)
    assert m["staleness_max"] == 2.0
    assert m["zero_spread_group_frac"] == 0.5
    assert m["offpolicy/clip_frac"] == 1.0 and m["offpolicy/weight_mean"] == pytest.approx(2.0)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # clipped against the proximal policy


def test_ppo_with_critic_and_kl_reference(tiny):
    _, model = tiny
    cfg = TorchBackend.Config(adv_est="gae", adv_est_args={"gamma": 1.0, "lam": 0.95}, policy_loss="grpo",
                              policy_loss_args={"kl_coef": 0.05}, ppo_epochs=2, num_mini_batches=2)
    backend = TorchBackend(cfg, copy.deepcopy(model))
    assert backend.ref_model is not None and backend.critic is not None
    head = backend.critic.value_head.weight.clone()
    m1 = backend.train_step(synthetic_batch(model))
    assert m1["kl"] >= 0 and m1["value_loss"] > 0 and "critic_grad_norm" in m1
    assert not torch.equal(head, backend.critic.value_head.weight)
    m2 = backend.train_step(synthetic_batch(model, seed=1))
    assert m2["kl"] > 0  # the policy has moved away from the frozen reference
    with pytest.raises(BatchError, match="group_ids"):
        TorchBackend(TorchBackend.Config(), copy.deepcopy(model)).train_step(
            synthetic_batch(model).replace(group_ids=None))


def test_checkpoint_round_trip_resumes_exactly(tiny, tmp_path):
    _, model = tiny
    cfg = TorchBackend.Config(adv_est="gae", policy_loss="ppo_clip", optimizer=OptimizerConfig(lr=1e-2))
    a = TorchBackend(cfg, copy.deepcopy(model))
    for s in range(2):
        a.train_step(synthetic_batch(model, seed=s))
    a.save_checkpoint(str(tmp_path))
    other = copy.deepcopy(model)
    torch.nn.init.normal_(other.lm_head.weight)  # a different starting point, overwritten by the load
    b = TorchBackend(cfg, other)
    live = b.named_parameters_for_sync()
    b.load_checkpoint(str(tmp_path))
    assert b.version == 2
    assert live["lm_head.weight"].data_ptr() == b.named_parameters_for_sync()["lm_head.weight"].data_ptr()
    batch = synthetic_batch(model, seed=7)
    ma, mb = a.train_step(batch), b.train_step(batch)
    assert ma["loss"] == mb["loss"] and ma["value_loss"] == mb["value_loss"]
    for (n, x), y in zip(a.named_parameters_for_sync().items(), b.named_parameters_for_sync().values()):
        assert torch.equal(x, y), n
    for x, y in zip(a.critic.parameters(), b.critic.parameters()):
        assert torch.equal(x, y)


DDP_RANK = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[3])
    from rl_testdata import TinyLM, synthetic_batch
    from rlsync.trainer import DistConfig, OptimizerConfig, TorchBackend
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    model = TinyLM(seed=rank)   # different inits: DDP must broadcast rank 0's
    ref = TinyLM(seed=0)
    cfg = TorchBackend.Config(optimizer=OptimizerConfig(lr=1e-2), dist=DistConfig(world_size=2, rank=rank, master_port=port))
    b = TorchBackend(cfg, model)
    full = synthetic_batch(ref, n=8, group=4)
    b.train_step(full.select(torch.arange(rank * 4, rank * 4 + 4)))
    torch.save(b.named_parameters_for_sync(), sys.argv[4] + f"/rank{rank}.pt")
""")


@pytest.mark.timeout(120)
def test_ddp_two_ranks_match_one_process_on_the_whole_batch(tmp_path):
    model = TinyLM(seed=0)
    port = free_port()
    here = os.path.dirname(__file__)
    procs = [subprocess.Popen([sys.executable, "-c", DDP_RANK, str(r), str(port), here, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    outs = [p.communicate(timeout=110)[0].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    single = TorchBackend(TorchBackend.Config(optimizer=OptimizerConfig(lr=1e-2)), copy.deepcopy(model))
    single.train_step(synthetic_batch(model, n=8, group=4))
    for n, t in single.named_parameters_for_sync().items():
        assert torch.equal(r0[n], r1[n]), f"ranks disagree on {n}"
        # Adam's first step is ~lr * sign(grad): float-summation-order noise in near-zero grads shows up
        # at ~1e-6 (lr 1e-2); a wrong gradient average would be off by ~lr.
        torch.testing.assert_close(r0[n], t, atol=1e-5, rtol=1e-4)
