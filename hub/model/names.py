"""Names of the objects the hub derives from a model, in one place (pure): the derived-object grammar.

A derived object of model `NAME` is the companion model `NAME@KIND`: its version v is made from `NAME` v
by the named derivation KIND (lowercase letters, digits, '_'). One grammar, several kinds:

- `NAME@delta`: version v holds the delta (v_base -> v) of `NAME` v (hub/delta/plan.py says how a delta
  object's tensors are named and chosen; the hub checks a delta's base and publisher).
- `NAME@bf16`, `NAME@int8`, ...: a *variant* of `NAME` v, made by a deterministic transform registered on
  the RL side (rlsync/core/transforms.py); the hub only records (base, version, transform) and lets one
  worker at a time derive it (hub/state/derived.py, docs/derived.md).
- Kinds compose left to right: `policy@bf16@delta` v is the delta of `policy@bf16` v.

A sharded version's layout travels as tensors of its own: `LAYOUT_TENSOR` (each rank's pieces) and an
empty tensor named `LAYOUT_DIGEST` + the whole layout's digest, so the hub refuses a rank that publishes
another layout than the version's (hub/reshard/layout.py).

    DerivedName.parse("policy@bf16@delta")   # DerivedName(base="policy@bf16", kind="delta")
    derived_model("policy", "int8")          # "policy@int8"
"""
from __future__ import annotations

import re
from dataclasses import dataclass

SEP = "@"
DELTA = "delta"
DELTA_SUFFIX = SEP + DELTA
LAYOUT_TENSOR = "__rlsync_layout__"
LAYOUT_DIGEST = "__rlsync_layout_digest__."
_KIND = re.compile(r"[a-z0-9_]{1,32}")


@dataclass(frozen=True, slots=True)
class DerivedName:
    """`base@kind`: version v of it is derived from `base` v by `kind` (the outermost derivation)."""

    base: str
    kind: str

    @property
    def name(self) -> str:
        return f"{self.base}{SEP}{self.kind}"

    @property
    def root(self) -> str:
        """The model at the bottom of the chain (`policy@bf16@delta` -> `policy`)."""
        return root_model(self.base)

    @staticmethod
    def parse(model: str) -> "DerivedName | None":
        """The outermost derivation of `model`, or None for a model published by a trainer."""
        base, sep, kind = model.rpartition(SEP)
        return DerivedName(base, kind) if sep and base and _KIND.fullmatch(kind) else None


def is_kind(kind: str) -> bool:
    """A valid derivation kind (what may follow '@')."""
    return isinstance(kind, str) and _KIND.fullmatch(kind) is not None


def derived_model(model: str, kind: str) -> str:
    if not is_kind(kind):
        raise ValueError(f"derivation kind {kind!r}: lowercase letters, digits and '_', at most 32")
    return DerivedName(model, kind).name


def root_model(model: str) -> str:
    d = DerivedName.parse(model)
    return model if d is None else root_model(d.base)


def is_variant_model(model: str) -> bool:
    """Derived by a transform (not a delta): `policy@bf16`, not `policy@delta` nor `policy`."""
    d = DerivedName.parse(model)
    return d is not None and d.kind != DELTA


def delta_model(model: str) -> str:
    return derived_model(model, DELTA)


def is_delta_model(model: str) -> bool:
    d = DerivedName.parse(model)
    return d is not None and d.kind == DELTA


def base_model(dm: str) -> str:
    """The model a derived model's objects are made from (`policy@delta` -> `policy`)."""
    d = DerivedName.parse(dm)
    if d is None:
        raise ValueError(f"{dm!r} is not a derived model name (NAME@KIND)")
    return d.base
