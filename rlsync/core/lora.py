"""LoRA adapters over a frozen base: the config, the peft wrapping and the tensor names both sides agree on.

The trainer (trainer/backend_torch.py) and the rollout engines (rollout/adapters.py) wrap the same HF model the
same way, so an adapter's tensors have one name on both sides whatever peft calls its modules:

    cfg = LoraConfig(rank=8, alpha=16, target_modules=["q_proj", "v_proj"])
    m = apply_lora(model, cfg)                 # a peft model, adapter "default", base frozen
    adapter_tensors(m)  # {"model.layers.0.self_attn.q_proj.lora_A.weight": live tensor, ...}
    base_tensors(m)     # {"model.layers.0.self_attn.q_proj.weight": live tensor, ...}: the HF names

It lives in this low room because the trainer and the rollout rooms both need it and import each other never.
peft is the optional `[lora]` extra (pyproject.toml); it is imported only when an adapter is built.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

_PEFT_PREFIX = "base_model.model."


@dataclass(kw_only=True)
class LoraConfig:
    rank: int = field(default=0, metadata={"ge": 0})
    """LoRA rank r; 0 = off (full-parameter training). With r > 0 the trainer trains only the adapter and each
    version is the adapter alone (sync route hub_adapter, docs/lora.md)."""
    alpha: float = 16.0
    """LoRA scaling numerator: the adapter's update is scaled by alpha / rank."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names (suffixes) that get an adapter."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def peft_config(self):
        from peft import LoraConfig as PeftLoraConfig

        return PeftLoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=list(self.target_modules),
                              lora_dropout=0.0, bias="none")


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, adapter: str = "default") -> torch.nn.Module:
    """`model` wrapped by peft with one adapter named `adapter` (lora_B zero: the wrapped model computes exactly
    what the base does); base parameters frozen."""
    from peft import get_peft_model

    return get_peft_model(model, cfg.peft_config(), adapter_name=adapter)


def _plain(name: str) -> str:
    return name[len(_PEFT_PREFIX):] if name.startswith(_PEFT_PREFIX) else name


def adapter_parameters(peft_model: torch.nn.Module, adapter: str = "default") -> dict[str, torch.nn.Parameter]:
    """name -> parameter of adapter `adapter`, named without peft's prefix and adapter name."""
    tag = re.compile(rf"\.(lora_[AB])\.{re.escape(adapter)}\.")
    return {tag.sub(r".\1.", _plain(n)): p for n, p in peft_model.named_parameters() if tag.search(n)}


def adapter_tensors(peft_model: torch.nn.Module, adapter: str = "default") -> dict[str, torch.Tensor]:
    """name -> live tensor (no copy) of adapter `adapter`, named as `adapter_parameters` names them."""
    return {n: p.data for n, p in adapter_parameters(peft_model, adapter).items()}


def base_parameters(peft_model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """name -> parameter of the frozen base, under the bare HF model's names (tied weights once)."""
    return {_plain(n).replace(".base_layer.", "."): p for n, p in peft_model.named_parameters() if ".lora_" not in n}


def base_tensors(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """name -> live tensor (no copy) of the frozen base, under the bare HF model's names (tied weights once)."""
    return {n: p.data for n, p in base_parameters(peft_model).items()}
