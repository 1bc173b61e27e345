"""`ValueModel`: a PPO critic, the transformer backbone of a causal LM with a scalar head.

    critic = ValueModel.from_causal_lm(policy)     # copies the policy's backbone, new zero head
    critic(input_ids=..., attention_mask=..., position_ids=...)  # -> [B, T] float values

Simplifies: the head is zero-initialised (values start at 0, so early advantages are the rewards);
the critic never shares weights with the policy.
"""

from __future__ import annotations

import copy

import torch


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_causal_lm(cls, lm: torch.nn.Module) -> "ValueModel":
        """A critic whose backbone is a copy of `lm`'s (a HF `*ForCausalLM`)."""
        backbone = copy.deepcopy(getattr(lm, lm.base_model_prefix))
        return cls(backbone, lm.config.hidden_size)

    def forward(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False).last_hidden_state
        return self.value_head(h).squeeze(-1)
