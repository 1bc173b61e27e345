"""The hub's bookkeeping as a state machine: models, versions, replicas, fetches. No I/O.

The server feeds it one request at a time (it is single-threaded by design) and turns its answers
into replies. Every method validates its whole input before it changes anything, so a refused call
leaves the state exactly as it was. Durability goes through the `commit_hook` (the journal), which
runs before a commit becomes visible.

One class, split by protocol into mixins (one file each; they share the tables made here):
    state_workers.py   Workers   join / heartbeat / expiry, who-holds-what queries, stats
    state_versions.py  Versions  publish and commit (journal hook), restore, re-register
    state_fetches.py   Fetches   plan / re-plan / finish a fetch (the planner picks sources)
    state_releases.py  Releases  release steps (retention decides), hand-offs, seed drops and tasks
    state_deltas.py    Deltas    full version or a chain of deltas for a reader holding an older one
    derived.py         Derivations  who derives a variant (one lease per variant version), its record
    annotations.py     Annotations  small opaque per-version values (journaled, dropped with the version)
    homes.py           Homes     one home per model: its own publishers or one gateway's home hub, never both
    state_records.py             the records those tables hold (WorkerRec, ReplicaRec, ...)
    state_index.py               the tables' indexes, kept current on every write (no scans)
Mixins rather than composed helper objects: every protocol reads and writes the same tables in
one single-threaded step, and the server and tests call `HubState` methods directly; helpers
would each need the whole state back anyway.

Replica ids are `worker:model:version:shard:slot`; slot is `live` (the worker's own buffers: a
trainer's parameters or a reader's fetch target) or `seed` (a host copy made by offload-seeding).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from rlsync.hub.delta.plan import DeltaConfig
from rlsync.hub.errors import InvalidArgumentError
from rlsync.hub.model.names import is_delta_model
from rlsync.hub.state.planner import PlannerConfig
from rlsync.hub.state.policy import ModelPolicies, ModelPolicy, ModelPolicyConfig
from rlsync.hub.state.retention import KEEP_OLD, RetentionConfig
from rlsync.hub.state.tenants import TenantConfig
from rlsync.hub.state.annotations import Annotations
from rlsync.hub.state.deltas import Deltas
from rlsync.hub.state.derived import Derivations, Lease
from rlsync.hub.state.fetches import Fetches, check_into_spec
from rlsync.hub.state.homes import Homes
from rlsync.hub.state.index import FetchTable, ReplicaTable, StateIndex
from rlsync.hub.state.records import (DONE, PENDING, SEED, FetchRec, ModelRec, Pin, Plan, Release, ReplicaRec,
                            VersionRec, WorkerRec)
from rlsync.hub.state.releases import ReleaseEvents, Releases
from rlsync.hub.state.versions import Versions
from rlsync.hub.state.workers import Workers

__all__ = ["DONE", "KEEP_OLD", "PENDING", "SEED", "FetchRec", "HubConfig", "HubState", "ModelRec", "Pin", "Plan",
           "Release", "ReplicaRec", "VersionRec", "WorkerRec", "check_into_spec"]


@dataclass(kw_only=True, slots=True)
class HubConfig:
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    """Source selection (topology, fan-out cap, striping, cross-DC)."""
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    """Which versions stay retrievable, and how the last replica lets go."""
    worker_timeout_s: float = 15.0
    """A worker silent for this long (no RPC, no heartbeat) is expired and its replicas dropped."""
    ticket_ttl_s: float = 10.0
    """Lifetime of a data-plane ticket issued with a fetch plan. A reader opens its connections right
    after it gets the plan (a re-plan issues fresh tickets), so seconds suffice; hosts' clocks must
    agree to well within this."""
    suspect_s: float = 10.0
    """A source a reader reported dead or stalled gets no new reads for this long (or until it expires)."""
    delta: DeltaConfig = field(default_factory=DeltaConfig)
    """Full version or chain of deltas, per reader (hub/delta/plan.py, docs/deltas.md)."""
    reregister_grace_s: float = 5.0
    """After a restart (a journal with committed versions), a fetch or re-plan that finds no holder yet
    waits up to this long for workers to re-register before the hub says lost / not retained."""
    models: list[ModelPolicyConfig] = field(default_factory=list)
    """Per-model policy: rules by model-name pattern overriding retention, fan-out cap and delta mode
    for the models they match (first match wins; hub/state/policy.py, docs/tenants.md)."""
    tenants: list[TenantConfig] = field(default_factory=list)
    """Tenants sharing this hub, each with its credential, scopes, quota and data-plane share
    (hub/state/tenants.py, docs/tenants.md). Empty: the hub token alone, with every scope."""

    def __post_init__(self) -> None:
        # A zero or negative timeout would expire every worker at its first tick (and nan never).
        for name, zero_ok in (("worker_timeout_s", False), ("ticket_ttl_s", False), ("suspect_s", True),
                              ("reregister_grace_s", True)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 if zero_ok else v > 0) \
                    or v == math.inf:
                raise InvalidArgumentError(f"HubConfig.{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, "
                                           f"got {v!r}")


class HubState(Workers, Versions, Fetches, Releases, Deltas, Derivations, Annotations, Homes):
    def __init__(self, cfg: HubConfig, commit_hook: Callable[..., None] | None = None,
                 clock: Callable[[], float] = time.monotonic, id_prefix: str = "",
                 annotate_hook: Callable[..., None] | None = None) -> None:
        self.cfg = cfg
        self.annotate_hook = annotate_hook  # journals an annotation before it is visible
        self.policies = ModelPolicies(cfg.planner, cfg.retention, cfg.delta, cfg.models)
        self.planner, self.retention = self.policies.default.planner, self.policies.default.retention
        self.commit_hook = commit_hook
        self.clock = clock
        self.workers: dict[str, WorkerRec] = {}
        self.models: dict[str, ModelRec] = {}
        # Dicts that keep `_index` (hub/state/index.py) current on every write: no query scans a table.
        self._index = StateIndex(self.workers)
        self.replicas: dict[str, ReplicaRec] = ReplicaTable(self._index)
        self.fetches: dict[str, FetchRec] = FetchTable(self._index)
        self.pending_releases: set[str] = set()
        self._release_events = ReleaseEvents(self.pending_releases)  # what poll_releases must re-check
        self._index.events = self._release_events
        self.leases: dict[tuple[str, int, str], Lease] = {}  # (variant model, version, shard) -> its deriver
        self.handoffs: dict[str, str] = {}     # releasing replica id -> seed worker asked to take it
        self.suspects: dict[str, float] = {}   # replica id -> no new reads until this time
        self._ids = itertools.count(1)
        self._sizes: dict[int, tuple] = {}  # id(manifest) -> (manifest, unit sizes): `Fetches._unit_sizes`
        self._prefix = id_prefix
        self.homes: dict[str, str] = {}  # model family root -> the hub it follows (hub/state/homes.py); absent: here
        self.home_hook: Callable[[str, str], None] | None = None  # journals a new entry before it counts

    # Per-model policy (hub/state/policy.py): every retention, planner and delta decision asks these.
    def policy(self, model: str) -> ModelPolicy:
        return self.policies.of(model)

    def retained_window(self, model: str) -> int:
        """How many newest committed versions of `model` stay retained (a delta model: at least its
        chain, so a reader a few versions behind finds one; docs/deltas.md)."""
        p = self.policy(model)
        keep = p.retention.cfg.retain_last
        return max(keep, p.delta.retain_chain) if is_delta_model(model) else keep
