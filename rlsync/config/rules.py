"""Value rules of the run's config: each field's bounds, and rules across fields, checked when it is composed.

A field's bounds are declared with it, in its metadata, and read here:

    world_size: int = field(default=1, metadata={"ge": 1})             # >= 1
    top_p: float = field(default=1.0, metadata={"gt": 0, "le": 1})     # > 0 and <= 1
    publish: str = field(default="auto", metadata={"one_of": ("auto", "gathered", "sharded")})

A section embedded from a room that declares no bounds itself (the trainer's `TrainerBackend.Config`, the
engine's `RolloutEngine.Config`, the `sync` section) carries them on the embedding field, by relative key:
`field(..., metadata={"bounds": {"optimizer.lr": {"gt": 0}}})`.

`check_values(cfg)` raises `ConfigError` with one line naming the key, the value and what is allowed:

    steps=0                   -> steps=0: must be >= 1
    trainer.zero_stage=4      -> trainer.zero_stage=4: must be in 0..3
    rollout.prompts_per_step=30 trainer.world_size=4
                              -> rollout.prompts_per_step=30: must be a multiple of trainer.world_size=4 ...

Registry names and components' own args are checked by `rlsync.config.compose.check_config`, which calls this.
`None` values are allowed (they mean "default") and not checked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

from rlsync.core.errors import ConfigError

BOUND_KEYS = ("ge", "gt", "le", "lt", "one_of")

GROUP_ESTIMATORS = ("grpo", "rloo")
"""Advantage estimators that compare a response with the others of its group: they need group_size >= 2."""


def describe(bounds: dict[str, Any]) -> str:
    """What `bounds` allow, as the error says it: `>= 1`, `> 0`, `in 0..3`, `> 0 and <= 1`, `one of a, b`."""
    if "one_of" in bounds:
        return "one of " + ", ".join(map(str, bounds["one_of"]))
    low = f">= {bounds['ge']:g}" if "ge" in bounds else f"> {bounds['gt']:g}" if "gt" in bounds else ""
    high = f"<= {bounds['le']:g}" if "le" in bounds else f"< {bounds['lt']:g}" if "lt" in bounds else ""
    if "ge" in bounds and "le" in bounds:
        return f"in {bounds['ge']:g}..{bounds['le']:g}"
    return " and ".join(x for x in (low, high) if x)


def within(value: Any, bounds: dict[str, Any]) -> bool:
    if "one_of" in bounds and value not in bounds["one_of"]:
        return False
    return not (("ge" in bounds and value < bounds["ge"]) or ("gt" in bounds and value <= bounds["gt"])
                or ("le" in bounds and value > bounds["le"]) or ("lt" in bounds and value >= bounds["lt"]))


def bounded_values(obj: Any, path: str = "") -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """(key, value, bounds) of every bounded field under the dataclass `obj` (mappings' entries included:
    `pools.main.size`), in declaration order."""
    for f in dataclasses.fields(obj):
        key, value = f"{path}.{f.name}" if path else f.name, getattr(obj, f.name)
        own = {k: v for k, v in f.metadata.items() if k in BOUND_KEYS}
        if own:
            yield key, value, own
        for rel, b in f.metadata.get("bounds", {}).items():
            v = value
            for part in rel.split("."):
                v = getattr(v, part, None)
            yield f"{key}.{rel}", v, b
        children = value.items() if isinstance(value, dict) else [(None, value)]
        for name, child in children:
            if dataclasses.is_dataclass(child) and not isinstance(child, type):
                yield from bounded_values(child, key if name is None else f"{key}.{name}")


def check_values(cfg: Any) -> None:
    """Raise `ConfigError` at the first value outside its bounds or breaking a rule across fields."""
    for key, v, bounds in bounded_values(cfg):
        if v is not None and not within(v, bounds):
            raise ConfigError(f"{key}={v}: must be {describe(bounds)}")
    r, t = cfg.rollout, cfg.trainer
    if r.prompts_per_step % t.world_size and not t.elastic.enabled:
        raise ConfigError(f"rollout.prompts_per_step={r.prompts_per_step}: must be a multiple of "
                          f"trainer.world_size={t.world_size} (each rank takes whole prompt groups)")
    if t.algo.adv_est in GROUP_ESTIMATORS and r.group_size < 2:
        raise ConfigError(f"rollout.group_size={r.group_size}: must be >= 2 with trainer.algo.adv_est="
                          f"{t.algo.adv_est} (it compares each response with the rest of its group)")
    if r.max_off_policy_versions is not None and r.max_off_policy_versions < r.max_staleness:
        raise ConfigError(f"rollout.max_off_policy_versions={r.max_off_policy_versions}: must be >= rollout.max_staleness="
                          f"{r.max_staleness} (requests start up to max_staleness versions ahead)")
    if sum(p.size for p in cfg.pools.values()) < 1:
        raise ConfigError(f"pools: {', '.join(f'{n}.size={p.size}' for n, p in cfg.pools.items()) or 'none'}: "
                          "at least one rollout worker is needed (pools.<name>.size >= 1)")
    for name, p in cfg.pools.items():
        if p.max_size and p.max_size < p.size:
            raise ConfigError(f"pools.{name}.max_size={p.max_size}: must be 0 (= size) or >= pools.{name}.size={p.size}")
        if p.engine.temperature != t.algo.temperature:
            raise ConfigError(f"pools.{name}.engine.temperature={p.engine.temperature}: must equal "
                              f"trainer.algo.temperature={t.algo.temperature} (else the log-probs do not match)")
    if t.elastic.enabled and t.elastic.min_world_size > t.world_size:
        raise ConfigError(f"trainer.elastic.min_world_size={t.elastic.min_world_size}: must be <= "
                          f"trainer.world_size={t.world_size}")
    if cfg.deterministic:
        check_deterministic(cfg)
    # whether `trainer.publish=sharded` fits the run is the weight-sync routes' call (compose.check_config)
    if cfg.resume not in ("auto", "never", "") and not (Path(cfg.resume) / "driver_state.json").is_file():
        raise ConfigError(f"resume={cfg.resume}: must be auto, never or a checkpoint directory (with driver_state.json)")


def check_deterministic(cfg: Any) -> None:
    """`deterministic=true` refuses what would make a seed's run depend on timing, naming the key to change."""
    for name, p in cfg.pools.items():
        if p.policy != "fixed":
            raise ConfigError(f"pools.{name}.policy={p.policy}: deterministic=true needs fixed pools (a {p.policy} "
                              "pool's joins and leaves land at timing-dependent points); set policy=fixed or "
                              "deterministic=false")
    if cfg.trainer.elastic.enabled:
        raise ConfigError("trainer.elastic.enabled=true: deterministic=true needs a static trainer group (a re-formed "
                          "group trains at another world size from a timing-dependent step); set it false or "
                          "deterministic=false")
    if cfg.rollout.engine != "hf":
        raise ConfigError(f"rollout.engine={cfg.rollout.engine}: deterministic=true seeds each request's sampling in "
                          "the hf engine only; use rollout.engine=hf or deterministic=false")
