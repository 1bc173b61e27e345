"""Composing the run's config: the Hydra store, `to_config`, the checks that refuse a mistake before Ray
starts, and what each actor is built from.

    register_configs()                        # the schema as `rlsync_train`, every recipe as `+recipe=NAME`
    cfg = to_config(dict_config)              # typed, plugins imported, checked (ConfigError / UnknownNameError)
    unknown_override("trainer.lrr=1")         # why a command-line key is not in the schema (None: it is)
    route_of(cfg)                             # the weight-sync route serving the run (rlsync/sync/)
    hub = hub_access(cfg, addr, token)        # how workers reach the run's hub
    trainer_kwargs(cfg, hub), rollout_kwargs(cfg, hub)   # what every trainer rank / rollout worker is built with

Only the driver and the command lines import this package; the actors take the sections these hand them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rlsync.config.rules import check_values
from rlsync.config.schema import TrainConfig
from rlsync.core.errors import ConfigError
from rlsync.sync import RunShape, SyncModeError, WeightSync, choose_route
from rlsync.trainer.backend import OptimizerConfig
from rlsync.workers.elastic import RUN_LR
from rlsync.workers.process import HubAccess, ProcessSetup


def recipe_files() -> dict[str, Path]:
    """Recipe name -> file: `recipes/NAME.yaml` and the test-only `recipes/tests/NAME.yaml` (as `tests/NAME`)."""
    import rlsync.recipes

    root = Path(rlsync.recipes.__file__).parent
    return {str(f.relative_to(root).with_suffix("")): f for f in sorted(root.rglob("*.yaml"))}


def register_configs() -> None:
    """Store the schema as `rlsync_train` (configs/train.yaml extends it) and every recipe as an option
    of group `recipe` (package `_global_`), so `+recipe=NAME` selects it and recipes can inherit each other."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from rlsync.trainer.algos import ALGORITHMS

    cs = ConfigStore.instance()
    schema = OmegaConf.structured(TrainConfig)
    # `task.args` holds the chosen task's own fields (checked against its Config by check_config): open, so
    # `task.args.dataset=NAME` needs no `+` (a task's fields are not known when the schema is composed).
    OmegaConf.set_struct(schema.task.args, False)
    cs.store(name="rlsync_train", node=schema)
    for name in ALGORITHMS.names():  # `trainer/algo=grpo|ppo|custom`: typed args per algorithm (trainer/algos.py)
        cs.store(group="trainer/algo", name=name, node=ALGORITHMS.get(name)(optimizer=OptimizerConfig(lr=RUN_LR)))
    for name, path in recipe_files().items():
        group, _, leaf = f"recipe/{name}".rpartition("/")
        cs.store(group=group, name=leaf, node=OmegaConf.load(path), package="_global_")


def to_config(cfg: Any) -> TrainConfig:
    """A `TrainConfig` from a DictConfig (Hydra) or a TrainConfig (passed through)."""
    if isinstance(cfg, TrainConfig):
        return cfg
    from omegaconf import OmegaConf

    from rlsync.trainer.algos import as_backend_config

    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), cfg))
    assert isinstance(obj, TrainConfig)
    obj.trainer.algo = as_backend_config(obj.trainer.algo)  # typed args -> the dicts the backend builds from
    return check_config(with_plugins(obj))


def with_plugins(cfg: TrainConfig) -> TrainConfig:
    """Resolve `plugin_path` to absolute directories (default: the working directory) and import `plugins`
    here, so the registries check their names; workers import them again from the same paths."""
    import os

    from rlsync.core.plugins import PluginError, load_plugins

    if cfg.plugins:
        cfg.plugin_path = [os.path.abspath(d) for d in (cfg.plugin_path or [os.getcwd()])]
        try:
            load_plugins(cfg.plugins, cfg.plugin_path)
        except PluginError as e:
            raise ConfigError(str(e)) from None
    return cfg


def _check_args(where: str, config_cls: type, args: dict[str, Any]) -> None:
    """`args` must be fields of `config_cls` of the right type (OmegaConf checks them against the dataclass)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    fields = sorted(f.name for f in dataclasses.fields(config_cls))
    unknown = sorted(set(args) - set(fields))
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: not a field of {config_cls.__qualname__}; valid: {', '.join(fields)}")
    try:
        OmegaConf.merge(OmegaConf.structured(config_cls), dict(args))
    except OmegaConfBaseException as e:
        raise ConfigError(f"{where}.{getattr(e, 'key', '') or ''}: {e.msg if hasattr(e, 'msg') else e}") from None


def task_args(name: str, args: dict[str, Any], config_cls: type) -> dict[str, Any]:
    """`task.args` checked against the task's Config and completed with its defaults, so the config (and
    `--cfg job`) shows every value the task is built with; a reward name must be registered (`task.args.reward`).
    `seed` is `task.seed`, not an arg."""
    from omegaconf import OmegaConf

    from rlsync.rollout.rewards import REWARDS

    if "seed" in args:
        raise ConfigError(f"task.args.seed={args['seed']}: set task.seed (the prompt stream's seed) instead")
    _check_args("task.args", config_cls, args)
    full = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(config_cls), dict(args)), enum_to_str=True)
    if isinstance(full.get("reward"), str):
        REWARDS.check(full["reward"], "task.args.reward")
    return {k: v for k, v in full.items() if k != "seed"}


def check_config(cfg: TrainConfig) -> TrainConfig:
    """Refuse names no registry knows and algorithm / task args their component does not declare, naming
    the key and the valid choices; called by `to_config`, so `python -m rlsync.train` fails before Ray starts.

        check_config(TrainConfig())                      # fine
        cfg.trainer.backend = "jax"; check_config(cfg)   # UnknownNameError: trainer.backend: unknown trainer backend 'jax'; known: deepspeed, torch
    """
    from rlsync.hub import transport_names
    from rlsync.pool.policies import POOL_POLICIES
    from rlsync.rollout import ENGINES, MODEL_LOADERS
    from rlsync.rollout.tasks import TASKS
    from rlsync.trainer.registry import ADV_ESTIMATORS, BACKENDS, CORRECTIONS, POLICY_LOSSES, VALUE_LOSSES

    t, a = cfg.trainer, cfg.trainer.algo
    BACKENDS.check(t.backend, "trainer.backend")
    ADV_ESTIMATORS.check(a.adv_est, "trainer.algo.adv_est")
    POLICY_LOSSES.check(a.policy_loss, "trainer.algo.policy_loss")
    if (corr := a.policy_loss_args.get("correction", "none")) != "none":
        CORRECTIONS.check(corr, "trainer.algo.policy_loss_args.correction")
    ENGINES.check(cfg.rollout.engine, "rollout.engine")
    MODEL_LOADERS.check(cfg.model.kind, "model.kind")
    TASKS.check(cfg.task.name, "task.name")
    for name, p in cfg.pools.items():
        POOL_POLICIES.check(p.policy, f"pools.{name}.policy")
    tr = cfg.hub.client.transport
    if tr is not None and tr not in transport_names():
        raise ConfigError(f"hub.client.transport: unknown transport {tr!r}; known: {', '.join(transport_names())}")
    _check_args("trainer.algo.adv_est_args", ADV_ESTIMATORS.get(a.adv_est).Config, a.adv_est_args)
    _check_args("trainer.algo.policy_loss_args", POLICY_LOSSES.get(a.policy_loss).Config, a.policy_loss_args)
    _check_args("trainer.algo.value_loss_args", VALUE_LOSSES.get("clipped").Config, a.value_loss_args)
    cfg.task.args = task_args(cfg.task.name, cfg.task.args, TASKS.get(cfg.task.name).Config)
    TASKS.get(cfg.task.name).check_args(dict(cfg.task.args))  # the task's own checks (a dataset's name, ...)
    check_values(cfg)  # bounds and rules across fields (rules.py)
    try:
        route_of(cfg)  # a weight-sync route serves this run (rlsync/sync/): else what to change
    except SyncModeError as e:
        if e.key == "trainer.publish":
            raise ConfigError(str(e)) from None
        raise
    return cfg


def sync_shape(cfg: TrainConfig) -> RunShape:
    """What choosing the run's weight-sync route needs to know beyond its `sync` section."""
    t = cfg.trainer
    return RunShape(backend=t.backend, zero_stage=t.zero_stage, publish=t.publish, trainer_world_size=t.world_size,
                    elastic_trainer=t.elastic.enabled, seed_dcs=bool(cfg.hub.seed_dcs),
                    moving_pools=tuple(n for n, p in cfg.pools.items() if p.policy != "fixed"),
                    rollout_engine=cfg.rollout.engine,
                    lora_rank=t.lora.rank, lora_alpha=float(t.lora.alpha), lora_targets=tuple(t.lora.target_modules))


def route_of(cfg: TrainConfig) -> type[WeightSync]:
    """The registered weight-sync route this run uses (`hub_full`, `hub_sharded`, `object_store`, ...)."""
    return choose_route(cfg.sync, sync_shape(cfg))


def unknown_override(override: str) -> str | None:
    """Why a command-line override `a.b.c=v` names no field of the schema (with the valid keys there), or None.

    Hydra refuses such a key too, but without the choices; this says them. `+a.b=v` is checked the same
    way (Hydra would add the key and the run would ignore it). A group choice `trainer/algo=NAME` must
    name a registered algorithm; `trainer.algo.<x>_args.K` must be a field of some algorithm's typed args
    (which one is chosen, Hydra checks when it composes). `+recipe=`, `~` overrides, Hydra's own keys
    and keys under a mapping (`pools.<name>`, `task.args`) are left to Hydra and `check_config`.
    """
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


# ---- what each actor is built from (its sections, never the whole config) ------------------------------
def hub_access(cfg: TrainConfig, address: str, token: str) -> HubAccess:
    """How the run's workers reach its hub at `address`."""
    return HubAccess(address=address, token=token, client=cfg.hub.client, model=cfg.hub.model_name)


def worker_setup(cfg: TrainConfig) -> ProcessSetup:
    """What every worker process of the run does first (plugins, log files, threads)."""
    return ProcessSetup(plugins=tuple(cfg.plugins), plugin_path=tuple(cfg.plugin_path), run_dir=cfg.run_dir,
                        torch_threads=cfg.ray.torch_threads, deterministic=cfg.deterministic)


def trainer_kwargs(cfg: TrainConfig, hub: HubAccess) -> dict[str, Any]:
    """What every `TrainerWorker` is built with besides the `trainer` section, its rank and port."""
    return dict(model=cfg.model, task=cfg.task, seed=cfg.seed, sync=cfg.sync, shape=sync_shape(cfg), hub=hub,
                setup=worker_setup(cfg))


def rollout_kwargs(cfg: TrainConfig, hub: HubAccess) -> dict[str, Any]:
    """What every `RolloutWorker` is built with besides its pool, index, and the pool's engine and location."""
    return dict(rollout=cfg.rollout, inject=cfg.inject, model=cfg.model, task=cfg.task, seed=cfg.seed,
                sync=cfg.sync, shape=sync_shape(cfg), hub=hub, setup=worker_setup(cfg))
