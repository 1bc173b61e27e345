"""Backend side of the elastic trainer group (issue 9), in one process: `reform` takes its weights
from the loader it is given (the hub, in a run) bit for bit; optimizer state loads from a checkpoint
that holds no weights."""

import copy
import os

import torch

from rlsync.trainer import DistConfig, OptimizerConfig, TorchBackend

from rl_testdata import synthetic_batch


def test_reform_writes_the_loaded_weights_into_the_live_parameters(tiny):
    _, model = tiny
    a = TorchBackend(TorchBackend.Config(optimizer=OptimizerConfig(lr=1e-2)), copy.deepcopy(model))
    b = TorchBackend(TorchBackend.Config(optimizer=OptimizerConfig(lr=1e-2)), copy.deepcopy(model))
    for _ in range(2):
        a.train_step(synthetic_batch(model))
    live = b.named_parameters_for_sync()
    ptrs = {n: t.data_ptr() for n, t in live.items()}
    source = a.named_parameters_for_sync()

    def load(into):  # what the worker does: hub.fetch(model, "latest", into=into)
        assert {n: t.data_ptr() for n, t in into.items()} == ptrs  # the live tensors, not copies
        for n, t in into.items():
            t.copy_(source[n])
        return 2

    assert b.reform(DistConfig(world_size=1), load, model_factory=None) == 2 == b.version
    assert all(torch.equal(live[n], source[n]) for n in live)
    assert all(p.grad is None for p in b.model.parameters())
    b.train_step(synthetic_batch(model))  # trains on from there
    assert b.version == 3


def test_optimizer_state_loads_from_a_checkpoint_without_its_weights(tiny, tmp_path):
    _, model = tiny
    a = TorchBackend(TorchBackend.Config(), copy.deepcopy(model))
    a.train_step(synthetic_batch(model))
    a.save_checkpoint(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "optimizer.pt"]
    os.remove(tmp_path / "model.pt")  # recovery must not need the weights file
    b = TorchBackend(TorchBackend.Config(), copy.deepcopy(model))
    assert b.load_optimizer_state(str(tmp_path))
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    assert not b.load_optimizer_state(str(tmp_path / "missing"))
    b.reset_optimizer()
    assert b.optimizer.state_dict()["state"] == {}
