"""Per-model hub policy: retention, fan-out cap and delta policy chosen by model name. Pure logic.

One `HubConfig` sets the hub's defaults; `HubConfig.models` adds rules, each a model-name pattern
(`fnmatch`: `team-a/*`, `*-lora`) with the fields it overrides. The first rule that matches a model
decides (a model's derived objects (`NAME@delta`, `NAME@bf16`) follow `NAME`'s rule); a field left None keeps the default.

    >>> p = ModelPolicies(PlannerConfig(), RetentionConfig(), DeltaConfig(),
    ...                   [ModelPolicyConfig(pattern="lora-*", retain_last=4, fanout_cap=1, delta_mode="never")])
    >>> p.of("lora-a").retention.cfg.retain_last, p.of("lora-a").planner.cfg.fanout_cap, p.of("base").delta.mode
    (4, 1, 'auto')
"""
from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass
from typing import NamedTuple

from rlsync.hub.delta.plan import DeltaConfig
from rlsync.hub.errors import InvalidArgumentError
from rlsync.hub.model.names import root_model
from rlsync.hub.state.planner import Planner, PlannerConfig
from rlsync.hub.state.retention import RetentionConfig, RetentionPolicy


@dataclass(kw_only=True, slots=True)
class ModelPolicyConfig:
    pattern: str
    """Model names this rule covers (fnmatch: `*`, `?`, `[ab]`); the first matching rule decides."""
    retain_last: int | None = None
    """`RetentionConfig.retain_last` for these models (None: the hub's)."""
    min_full_copies: int | None = None
    """`RetentionConfig.min_full_copies` for these models (None: the hub's)."""
    fanout_cap: int | None = None
    """`PlannerConfig.fanout_cap` for reads of these models (None: the hub's)."""
    max_sources: int | None = None
    """`PlannerConfig.max_sources` for reads of these models (None: the hub's)."""
    delta_mode: str | None = None
    """`DeltaConfig.mode` (auto | always | never) for these models (None: the hub's)."""


class ModelPolicy(NamedTuple):
    retention: RetentionPolicy
    planner: Planner
    delta: DeltaConfig


class ModelPolicies:
    """The policy of each model, built once per rule (a rule's values are checked when the hub starts)."""

    def __init__(self, planner: PlannerConfig, retention: RetentionConfig, delta: DeltaConfig,
                 rules: list[ModelPolicyConfig] = ()) -> None:
        self.default = ModelPolicy(RetentionPolicy(retention), Planner(planner), delta)
        self._rules: list[tuple[str, ModelPolicy]] = []
        for r in rules:
            if not isinstance(r.pattern, str) or not r.pattern:
                raise InvalidArgumentError(f"HubConfig.models: every rule needs a non-empty pattern, got {r.pattern!r}")
            try:
                ret = dataclasses.replace(retention, **_set(retain_last=r.retain_last,
                                                            min_full_copies=r.min_full_copies))
                plan = dataclasses.replace(planner, **_set(fanout_cap=r.fanout_cap, max_sources=r.max_sources))
                dl = dataclasses.replace(delta, **_set(mode=r.delta_mode))
                if plan.fanout_cap < 1 or plan.max_sources < 1:
                    raise ValueError("fanout_cap and max_sources must be >= 1")
                self._rules.append((r.pattern, ModelPolicy(RetentionPolicy(ret), Planner(plan), dl)))
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"HubConfig.models rule {r.pattern!r}: {e}") from None
        self._of: dict[str, ModelPolicy] = {}

    def of(self, model: str) -> ModelPolicy:
        p = self._of.get(model)
        if p is None:
            name = root_model(model)  # a derived object (NAME@delta, NAME@bf16, ...) follows NAME
            p = next((pol for pat, pol in self._rules if fnmatch.fnmatchcase(name, pat)), self.default)
            self._of[model] = p
        return p


def _set(**fields) -> dict:
    return {k: v for k, v in fields.items() if v is not None}
