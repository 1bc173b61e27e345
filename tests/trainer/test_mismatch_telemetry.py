"""Sampler-vs-trainer mismatch per step (trainer/backend.py `_mismatch`, docs/derived.md): k3 KL and the share
of importance weights beyond 1 +- 0.2, over the tokens the trainer's current version sampled only."""
import math

import torch

from rlsync.core.batch import Batch
from rlsync.trainer.backend import _mismatch


def test_k3_and_clip_fraction_over_fresh_tokens_only():
    rmask = torch.tensor([[0, 1, 1, 1, 0], [0, 1, 1, 0, 0]])
    old = torch.zeros(2, 5)
    b = Batch(input_ids=torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 5), response_mask=rmask,
              old_logprobs=old, rewards=torch.zeros(2), versions=torch.tensor([3, 2]))
    lp = torch.zeros(2, 5)
    lp[0, 1], lp[0, 2] = math.log(2.0), math.log(0.5)   # fresh sample (v3): ratios 2, 0.5, 1
    lp[1, 1] = 5.0                                       # stale sample (v2): not counted
    m = _mismatch(lp, b, version=3)
    d = torch.tensor([math.log(2.0), math.log(0.5), 0.0])
    assert math.isclose(m["mismatch/k3"], float((d.exp() - d - 1).mean()), rel_tol=1e-6)
    assert math.isclose(m["mismatch/is_clip_frac"], 2 / 3, rel_tol=1e-6)
    assert math.isnan(_mismatch(lp, b, version=9)["mismatch/k3"])  # no fresh sample: NaN, not 0
