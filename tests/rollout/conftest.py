import pytest


@pytest.fixture(scope="module")
def tiny():
    """(task, model) for the reverse task: a random-init Llama of hidden 64, 2 layers, vocab 16."""
    from rlsync.rollout import TinyModelConfig, build_task, build_tiny_model

    task = build_task("reverse", seed=0)
    return task, build_tiny_model(TinyModelConfig(seed=0), task.tokenizer.vocab_size)
