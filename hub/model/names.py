"""Names of the objects the hub derives from a model, in one place (pure).

- `NAME@delta`: the companion model whose version v holds the delta (v_base -> v) of `NAME` v
  (hub/delta/plan.py says how a delta object's tensors are named and chosen).
- A sharded version's layout travels as tensors of its own: `LAYOUT_TENSOR` (each rank's pieces) and an
  empty tensor named `LAYOUT_DIGEST` + the whole layout's digest, so the hub refuses a rank that publishes
  another layout than the version's (hub/reshard/layout.py).
"""
from __future__ import annotations

DELTA_SUFFIX = "@delta"
LAYOUT_TENSOR = "__rlsync_layout__"
LAYOUT_DIGEST = "__rlsync_layout_digest__."


def delta_model(model: str) -> str:
    return model + DELTA_SUFFIX


def is_delta_model(model: str) -> bool:
    return model.endswith(DELTA_SUFFIX)


def base_model(dm: str) -> str:
    """The model a delta model's objects are deltas of (`policy@delta` -> `policy`)."""
    return dm[:-len(DELTA_SUFFIX)]
