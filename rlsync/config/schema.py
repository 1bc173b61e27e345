"""The run's configuration: typed dataclasses, each field documented, registered in Hydra's ConfigStore.

`python -m rlsync.train` composes `configs/train.yaml` (whose first default is the schema
`rlsync_train`, stored by rlsync/config/compose.py) with a recipe (`+recipe=grpo_standalone`) and
command-line overrides; OmegaConf checks every value against these types. `--cfg job` prints the result.

    cfg = TrainConfig()                       # the same defaults without Hydra (tests, notebooks)
    cfg.pools["main"].size = 2

A component's own section is declared beside it and assembled here (`TrainerGroupConfig` in
workers/elastic.py, `RolloutConfig` in workers/rollout_worker.py, `PoolConfig` in pools/policies.py,
`ModelConfig`/`TaskConfig` in workers/policy.py, `SyncConfig` in sync/base.py); this file declares the
run-level ones. Nothing below the driver imports this package: each actor is built from its sections.
A field's bounds sit in its metadata (`field(default=1, metadata={"ge": 1})`), read by rules.py.

Rollout pools are a named mapping (`pools.main.size=2`, `+pools.far=...`) so pools of other kinds
(elastic, spot, cross-DC) are more entries of the same shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rlsync.hub import ClientConfig, HubConfig, RetentionConfig
from rlsync.pool.policies import PoolConfig
from rlsync.sync import SyncConfig
from rlsync.telemetry.loggers import LoggingConfig
from rlsync.workers.elastic import TrainerGroupConfig
from rlsync.workers.policy import ModelConfig, TaskConfig
from rlsync.workers.rollout_worker import InjectConfig, RolloutConfig


@dataclass(kw_only=True)
class RayConfig:
    address: str | None = None
    """Ray cluster to join ('auto' or host:port); None starts a local cluster for this run."""
    num_cpus: int = field(default=8, metadata={"ge": 1})
    """Logical CPUs of a cluster this run starts (actors ask for `actor_num_cpus` each)."""
    actor_num_cpus: float = field(default=0.5, metadata={"gt": 0})
    """Logical CPUs each worker actor reserves (fractions pack several actors on a small machine)."""
    torch_threads: int = 1
    """Intra-op threads per worker actor; tiny models run fastest on one."""


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
class EvalConfig:
    """Held-out greedy evaluation (rlsync/driver/evaluation.py), logged as `eval/*`."""

    every: int = field(default=0, metadata={"ge": 0})
    """Evaluate at the start and every this many steps (and at the last step); 0: never."""
    prompts: int = field(default=64, metadata={"ge": 1})
    """Held-out prompts per evaluation."""
    seed: int = 10_007
    """Seed of the held-out prompt stream (the training stream uses task.seed)."""


SYNC_BOUNDS: dict[str, dict[str, Any]] = {
    "wait_s": {"ge": 1e-3, "le": 600},  # the hub parks one wait_latest for at most 600 s
    "board_poll_s": {"gt": 0},
    "kv_policy": {"one_of": ("keep", "recompute")},
    "stage_nice": {"ge": 0, "le": 20},
    "stage_escalate_s": {"ge": 0}}
"""Bounds of the `sync` section's fields (declared in rlsync/sync/base.py), as the run checks them."""


@dataclass(kw_only=True)
class CheckpointConfig:
    every: int = field(default=0, metadata={"ge": 0})
    """Save every this many steps (and at the end); 0: only at the end."""
    keep: int = field(default=2, metadata={"ge": 1})
    """Newest checkpoints kept on disk."""
    enabled: bool = True
    """Off: never write checkpoints."""


@dataclass(kw_only=True)
class TrainConfig:
    steps: int = field(default=200, metadata={"ge": 1})
    """Trainer steps (= versions published after the initial one)."""
    seed: int = 0
    """Seeds model init and sampling."""
    deterministic: bool = False
    """True: the same per-step rewards for a seed at any machine load — a synchronous, on-policy schedule (no
    overlap of generation and training), each chunk of a step's prompts to a fixed worker with a sampling seed
    derived from `seed`, results used in a fixed order, deterministic torch kernels. Slower (nothing overlaps);
    refuses spot/autoscale pools, an elastic trainer and rollout.engine=vllm. False (default): asynchronous,
    up to rollout.max_staleness versions of overlap; a seed fixes the init and the prompts, not the run.
    docs/rl.md, "Repeatable runs"."""
    run_dir: str | None = None
    """Where metrics.jsonl, trace.json, wandb/, checkpoints/ and train.log go (from the command line it is Hydra's
    run dir too); None: Hydra's `hydra.run.dir` (default runs/<date>/<time>/)."""
    resume: str = "never"
    """`auto`: continue from the newest checkpoint in run_dir if there is one; `never`; or a checkpoint dir."""
    timeout_s: float = field(default=600.0, metadata={"gt": 0})
    """Longest the driver waits on its workers with nothing finishing (a group starting, a train step, no rollout
    or train call back) before it ends the run with an error. Not a limit on the run's length."""
    max_failed_requests: int = field(default=10, metadata={"ge": 0})
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
    sync: SyncConfig = field(default_factory=SyncConfig, metadata={"bounds": SYNC_BOUNDS})
    """How weights reach the engines: hub (default), object_store or broadcast (the baselines; docs/real_model.md)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out greedy evaluation every N steps (`eval/*`)."""


def as_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
