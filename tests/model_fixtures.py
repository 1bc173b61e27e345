"""Fixtures shared by the trainer and rollout tests (imported by their conftest.py files)."""
import pytest


@pytest.fixture(scope="module")
def tiny():
    """(task, model) for the reverse task: a random-init Llama of hidden 64, 2 layers, vocab 16."""
    from rlsync.rollout import TinyModelConfig, build_task, build_tiny_model

    task = build_task("reverse", seed=0)
    return task, build_tiny_model(TinyModelConfig(seed=0), task.tokenizer.vocab_size)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one intra-op thread, and leave the other core to the rest of the suite."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
