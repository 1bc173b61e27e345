"""`PayloadAudit`: proof that weights never cross Ray in the driver's calls.

Every tensor the driver sends or receives is counted (`ray/payload_bytes`) and checked against the
model's parameter shapes (`ray/weight_like_tensors`, always 0: weights move only through the hub).

    audit = PayloadAudit({"w": (64, 64)}); audit.see(result); audit.weight_like   # 0
"""

from __future__ import annotations

from typing import Any

import torch

from rlsync.core.batch import Batch
from rlsync.core.events import RolloutResult


class PayloadAudit:
    """Counts tensor bytes crossing Ray in the driver's calls and flags any shaped like a parameter."""

    def __init__(self, param_shapes: dict[str, tuple[int, ...]], min_numel: int = 256):
        self.shapes = {s for s in param_shapes.values() if _numel(s) >= min_numel}
        self.bytes = 0
        self.weight_like = 0

    def see(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            self.bytes += obj.numel() * obj.element_size()
            self.weight_like += tuple(obj.shape) in self.shapes
        elif isinstance(obj, (Batch, RolloutResult)):
            for v in vars(obj).values():
                self.see(v)
        elif isinstance(obj, dict):
            for v in obj.values():
                self.see(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                self.see(v)
        return obj


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
