"""Weight digests: equal iff two sets of tensors are bit-for-bit equal (names, dtypes, shapes, bytes)."""

from __future__ import annotations

import hashlib

import torch


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(x.numel() * x.element_size() for x in tensors.values())


def weights_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the tensors' names, dtypes, shapes and bytes, in name order: equal iff bit-for-bit equal."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
