"""Value rules of the run's config: ranges, and rules across fields, checked when the config is composed.

`check_values(cfg)` raises `ConfigError` with one line naming the key, the value and what is allowed:

    steps=0                   -> steps=0: must be >= 1
    trainer.zero_stage=4      -> trainer.zero_stage=4: must be in 0..3
    rollout.prompts_per_step=30 trainer.world_size=4
                              -> rollout.prompts_per_step=30: must be a multiple of trainer.world_size=4 ...

Registry names and components' own args are checked by `rlsync.config.check_config`, which calls this.
A key with `*` applies to every entry of a mapping (`pools.*.size`: every pool).

`unknown_override(arg)` checks one command-line override's key against the schema before Hydra
composes anything, so a typo is refused with the keys valid there (Hydra names the key only).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Iterator

INF = math.inf

# key, lowest, highest (inclusive); `None` values are allowed (they mean "default") and not checked.
RANGES: list[tuple[str, float, float]] = [
    ("steps", 1, INF),
    ("timeout_s", 1e-9, INF),
    ("max_failed_requests", 0, INF),
    ("trainer.world_size", 1, INF),
    ("trainer.zero_stage", 0, 3),
    ("trainer.algo.optimizer.lr", 1e-12, INF),
    ("trainer.algo.critic_optimizer.lr", 1e-12, INF),
    ("trainer.algo.grad_clip", 1e-12, INF),
    ("trainer.algo.ppo_epochs", 1, INF),
    ("trainer.algo.num_mini_batches", 1, INF),
    ("trainer.algo.temperature", 1e-6, INF),
    ("trainer.elastic.min_world_size", 1, INF),
    ("rollout.prompts_per_step", 1, INF),
    ("rollout.group_size", 1, INF),
    ("rollout.prompts_per_request", 1, INF),
    ("rollout.max_staleness", 0, INF),
    ("pools.*.size", 0, INF),
    ("pools.*.min_size", 0, INF),
    ("pools.*.max_size", 0, INF),
    ("pools.*.engine.temperature", 1e-6, INF),
    ("pools.*.engine.top_p", 1e-9, 1),
    ("pools.*.engine.top_k", 0, INF),
    ("pools.*.engine.max_new_tokens", 0, INF),
    ("pools.*.churn.notice_fraction", 0, 1),
    ("ray.num_cpus", 1, INF),
    ("ray.actor_num_cpus", 1e-6, INF),
    ("sync.wait_s", 1e-3, 600),  # the hub parks one wait_latest for at most 600 s
    ("sync.board_poll_s", 1e-6, INF),
    ("checkpoint.every", 0, INF),
    ("checkpoint.keep", 1, INF),
    ("inject.weights_delay_s", 0, INF),
    ("inject.generate_delay_s", 0, INF),
]

GROUP_ESTIMATORS = ("grpo", "rloo")
"""Advantage estimators that compare a response with the others of its group: they need group_size >= 2."""


def _values(obj: Any, parts: list[str], path: str = "") -> Iterator[tuple[str, Any]]:
    if not parts:
        yield path, obj
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        for k, v in obj.items():
            yield from _values(v, rest, f"{path}.{k}")
    else:
        yield from _values(getattr(obj, head), rest, f"{path}.{head}" if path else head)


def _bound(lo: float, hi: float) -> str:
    low = "> 0" if 0 < lo < 1e-3 else f">= {lo:g}"
    if hi == INF:
        return low
    return f"in {lo:g}..{hi:g}" if low.startswith(">=") else f"{low} and <= {hi:g}"


def check_values(cfg: Any) -> None:
    """Raise `ConfigError` at the first value outside its range or breaking a rule across fields."""
    from rlsync.config import ConfigError

    for key, lo, hi in RANGES:
        for where, v in _values(cfg, key.split(".")):
            if v is not None and not (lo <= v <= hi):
                raise ConfigError(f"{where}={v}: must be {_bound(lo, hi)}")
    r, t = cfg.rollout, cfg.trainer
    if r.prompts_per_step % t.world_size and not t.elastic.enabled:
        raise ConfigError(f"rollout.prompts_per_step={r.prompts_per_step}: must be a multiple of "
                          f"trainer.world_size={t.world_size} (each rank takes whole prompt groups)")
    if t.algo.adv_est in GROUP_ESTIMATORS and r.group_size < 2:
        raise ConfigError(f"rollout.group_size={r.group_size}: must be >= 2 with trainer.algo.adv_est="
                          f"{t.algo.adv_est} (it compares each response with the rest of its group)")
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
    _check_publish(cfg)
    if cfg.resume not in ("auto", "never", "") and not (Path(cfg.resume) / "driver_state.json").is_file():
        raise ConfigError(f"resume={cfg.resume}: must be auto, never or a checkpoint directory (with driver_state.json)")


PUBLISH_MODES = ("auto", "gathered", "sharded")


def _check_publish(cfg: Any) -> None:
    from rlsync.config import ConfigError

    p = cfg.trainer.publish
    if p not in PUBLISH_MODES:  # whether `sharded` fits the run is the weight-sync routes' call (check_config)
        raise ConfigError(f"trainer.publish={p}: must be one of {', '.join(PUBLISH_MODES)}")


def unknown_override(override: str) -> str | None:
    """Why a command-line override `a.b.c=v` names no field of the schema (with the valid keys there), or None.

    Hydra refuses such a key too, but without the choices; this says them. `+a.b=v` is checked the same
    way (Hydra would add the key and the run would ignore it). A group choice `trainer/algo=NAME` must
    name a registered algorithm; `trainer.algo.<x>_args.K` must be a field of some algorithm's typed args
    (which one is chosen, Hydra checks when it composes). `+recipe=`, `~` overrides, Hydra's own keys
    and keys under a mapping (`pools.<name>`, `task.args`) are left to Hydra and `check_config`.
    """
    from rlsync.config import TrainConfig
    from rlsync.trainer.algos import ALGORITHMS
    from rlsync.trainer.backend import TrainerBackend

    key, _, value = override.partition("=")
    key = key.lstrip("+")  # `+key=`/`++key=` add a key: it must be in the schema too
    if not _ or key.startswith(("~", "hydra")) or key == "recipe":
        return None
    if key == "trainer/algo":
        return None if value in ALGORITHMS else (f"unknown algorithm trainer/algo={value}; "
                                                 f"known: {', '.join(ALGORITHMS.names())}")
    node: Any = TrainConfig
    parent: Any = None
    path: list[str] = []
    for part in key.split("."):
        if parent is TrainerBackend.Config and path[-1].endswith("_args"):  # typed per algorithm
            return _unknown_algo_arg(key, path[-1], part, ALGORITHMS)
        if not (isinstance(node, type) and dataclasses.is_dataclass(node)):
            return None  # a mapping or a leaf: Hydra/OmegaConf check the rest
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            where = ".".join(path) or "the top level"
            return f"unknown config key {key!r}: {where} has {', '.join(sorted(fields))}"
        path.append(part)
        parent, node = node, _field_type(node, fields[part])
    return None


def _unknown_algo_arg(key: str, args_field: str, name: str, algorithms: Any) -> str | None:
    """`trainer.algo.<args_field>.<name>`: a field of that args type in some typed algorithm, or the choices."""
    import typing

    have = {}
    for algo in algorithms.names():
        t = typing.get_type_hints(algorithms.get(algo)).get(args_field)
        if isinstance(t, type) and dataclasses.is_dataclass(t):
            have[algo] = sorted(f.name for f in dataclasses.fields(t))
    if not have or any(name in fs for fs in have.values()):
        return None
    return (f"unknown config key {key!r}: trainer.algo.{args_field} has "
            + "; ".join(f"(trainer/algo={a}) {', '.join(fs)}" for a, fs in have.items()))


def _field_type(owner: type, f: dataclasses.Field) -> Any:
    import typing

    try:
        return typing.get_type_hints(owner)[f.name]
    except Exception:  # noqa: BLE001 - an unresolvable annotation: stop checking there
        return None
