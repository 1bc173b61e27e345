"""`PoolSet`: the run's rollout pools — named elastic worker groups with a location and a policy — and seeds.

A pool (`pools.<name>` in the config, or attached to a running job with `python -m rlsync.pools join`)
is a `WorkerGroup` of `RolloutWorker`s plus each member's lifecycle state:

    joining -> the actor starts, joins the hub and fetches `latest` (`RolloutWorker.join_run`: the
               planner prefers peers near it over the trainer);
    ready   -> the driver hands it prompts;
    leaving -> preempted with notice, shrunk, or its pool asked to leave: no new work; once its call
               is back it runs `hub.leave(deadline_s=notice)` (retention hands off what only it holds),
               then the actor ends;
    gone    -> killed without notice (`ray.kill`: the hub expires it by heartbeat), died, or left.

Policies (`pools.<name>.policy`, a registry in policies.py): `fixed`; `spot` (a seeded `ChurnSchedule`
preempts and adds workers after given steps); `autoscale` (one worker more or less per cooldown).

`PoolSet` is what the driver talks to, and it never blocks: joins and leaves are Ray refs that the
driver's `ray.wait` includes (`refs()`, then `handle(ref)`). It also runs one seed worker per DC in
`hub.seed_dcs`, and the job's `PoolRegistry` (a named actor in the job's Ray namespace) through which
`python -m rlsync.pools` attaches and detaches pools (attach.py): the CLI starts named detached
actors, has them fetch, and registers them; the driver polls the registry about once a second and adopts them.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import ray

from rlsync.pool.attach import REGISTRY, PoolRegistry, ray_client_auth, remove_job_files, write_job_file
from rlsync.pool.policies import POOL_POLICIES, PoolConfig, PoolPolicy
from rlsync.telemetry.sync_sources import Place, SourceLedger
from rlsync.workers.group import WorkerGroup
from rlsync.workers.process import HubAccess, ProcessSetup
from rlsync.workers.rollout_worker import RolloutWorker
from rlsync.workers.seed_worker import SeedWorker

log = logging.getLogger(__name__)

SYNC_EVERY_S = 1.0


class Member(str, Enum):
    """A pool member's lifecycle state (see the module docstring)."""

    JOINING = "joining"
    READY = "ready"
    LEAVING = "leaving"


def rollout_group(name: str, pool: PoolConfig, rollout_kwargs: dict[str, Any], *, num_cpus: float,
                  first_index: int = 0, resources: dict[str, float] | None = None) -> WorkerGroup:
    """The `WorkerGroup` of pool `name`: `RolloutWorker`s with the pool's engine and location, plus
    `rollout_kwargs` (what every rollout worker of the run is built with: rollout, inject, model, task,
    seed, sync, shape, hub, setup; `rlsync.config.compose.rollout_kwargs`)."""
    return WorkerGroup(name, RolloutWorker,
                       lambda i: dict(rollout_kwargs, pool=name, index=i, engine=pool.engine, location=pool.location),
                       num_cpus=num_cpus, first_index=first_index, resources=resources)


@dataclass
class RolloutPool:
    name: str
    cfg: PoolConfig
    group: WorkerGroup
    attached: bool = False
    """Attached from another terminal (`python -m rlsync.pools join`): its actors are named and detached."""
    policy: PoolPolicy | None = None
    """What the pool does after each step (None: attached pools, which only their CLI resizes)."""
    state: dict[str, Member] = field(default_factory=dict)
    """worker key -> joining | ready | leaving."""
    deadline: dict[str, float] = field(default_factory=dict)
    """leaving worker key -> monotonic time its notice runs out."""

    def live(self) -> list[str]:
        """Members that are or will be useful (joining or ready)."""
        return [k for k, s in self.state.items() if s in (Member.JOINING, Member.READY)]

    def ready(self) -> list[str]:
        return [k for k, s in self.state.items() if s == Member.READY]

    @property
    def max_size(self) -> int:
        return self.cfg.max_size or self.cfg.size


class PoolSet:
    def __init__(self, pools: dict[str, PoolConfig], rollout_kwargs: dict[str, Any], *, run_dir: Path, steps: int,
                 seed_dcs: list[str], trainer_dc: str, num_cpus: float):
        """`pools`: the run's `pools` section; `rollout_kwargs`: see `rollout_group` (its `hub` and `setup` also
        build the seed workers); `steps`: the run's length (the spot policy's schedule); `seed_dcs`: a seed
        worker each; `num_cpus`: what each actor reserves."""
        self.configured, self.rollout_kwargs = pools, rollout_kwargs
        self.hub: HubAccess = rollout_kwargs["hub"]
        self.setup: ProcessSetup = rollout_kwargs["setup"]
        self.run_dir, self.steps, self.seed_dcs, self.num_cpus = Path(run_dir), steps, list(seed_dcs), num_cpus
        for name, p in pools.items():
            POOL_POLICIES.check(p.policy, f"pools.{name}.policy")
            POOL_POLICIES.get(p.policy).validate(name, p)
        self.namespace = f"rlsync-{secrets.token_hex(6)}"
        self.pools: dict[str, RolloutPool] = {}
        self.seeds: dict[str, WorkerGroup] = {}
        self.ledger = SourceLedger(trainer_dc=trainer_dc)
        self._joining: dict[Any, tuple[str, str]] = {}
        self._leaving: dict[Any, tuple[str, str]] = {}
        self._events: dict[str, float] = {}
        self._sync_ref = None
        self._next_sync = 0.0
        self.registry = None
        self.job_file: Path | None = None

    # ------------------------------------------------------------------------------------ set-up
    def _group(self, name: str, pool: PoolConfig) -> WorkerGroup:
        return rollout_group(name, pool, self.rollout_kwargs, num_cpus=self.num_cpus)

    def start(self) -> None:
        """Start every configured pool's workers, the seed workers and the registry (asynchronous)."""
        for name, p in self.configured.items():
            if p.policy == "fixed" and p.size == 0:
                continue  # a default pool a recipe switched off (`pools.main.size: 0`)
            pool = RolloutPool(name, p, self._group(name, p), policy=POOL_POLICIES.get(p.policy)(name, p, self.steps))
            self.pools[name] = pool
            for _ in range(p.size):
                self.add_member(pool)
        for dc in self.seed_dcs:
            g = WorkerGroup(f"seed-{dc}", SeedWorker, lambda i, dc=dc: dict(dc=dc, hub=self.hub, setup=self.setup),
                            num_cpus=min(0.25, self.num_cpus))
            g.start(1)
            self.seeds[dc] = g
        self.registry = ray.remote(PoolRegistry).options(name=REGISTRY, namespace=self.namespace,
                                                          num_cpus=0).remote()

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the initial workers and seeds joined the hub (start-up only)."""
        seeds = [h.info.remote() for g in self.seeds.values() for h in g.members.values()]
        end = time.monotonic() + timeout_s
        while self._joining:
            ready, _ = ray.wait(list(self._joining), num_returns=1, timeout=max(0.1, end - time.monotonic()))
            if not ready:
                raise TimeoutError(f"rollout workers not ready in {timeout_s:.0f}s: {sorted(self._joining.values())}")
            self.handle(ready[0], raise_errors=True)
        for info in ray.get(seeds, timeout=max(1.0, end - time.monotonic())):
            self.ledger.places[info["wid"]] = Place(kind="seed", dc=info["dc"])
        self._events.clear()  # the initial workers are not mid-run joins

    def write_job_file(self, config: dict[str, Any]) -> Path:
        """RUN_DIR/job.json for `python -m rlsync.pools`; `config`: the run's whole config as a dict (the CLI
        builds attached pools' workers from it as the driver built its own)."""
        info = {"ray_address": ray.get_runtime_context().gcs_address, "namespace": self.namespace,
                "hub_address": self.hub.address, "hub_token": self.hub.token, "model": self.hub.model,
                "run_dir": str(self.run_dir.resolve()), "driver_pid": os.getpid(), **ray_client_auth(self.run_dir),
                "started_from": os.getcwd(),  # `python -m rlsync.pools` from the same directory finds it
                "config": json.loads(json.dumps(config, default=str))}
        self.job_file = write_job_file(self.run_dir, info)
        return self.job_file

    # ------------------------------------------------------------------------------------ queries
    def free(self, busy: set[str]) -> Iterator[tuple[str, str, Any]]:
        """(pool, key, handle) of ready workers without a call in flight."""
        for name, p in self.pools.items():
            for key, s in list(p.state.items()):
                if s == Member.READY and key not in busy:
                    yield name, key, p.group.members[key]

    def ready_count(self) -> int:
        return sum(s == Member.READY for p in self.pools.values() for s in p.state.values())

    def alive(self) -> bool:
        return any(p.live() for p in self.pools.values())

    def refs(self) -> list:
        return [*self._joining, *self._leaving, *([self._sync_ref] if self._sync_ref is not None else [])]

    def drain_refs(self) -> dict[str, Any]:
        """Stall-record refs of every member that answers now (not the ones still starting) and of seeds."""
        out = {}
        for p in self.pools.values():
            for key, s in p.state.items():
                if s != Member.JOINING and key in p.group.members:
                    out[key] = p.group.members[key].drain_stall.options(concurrency_group="telemetry").remote()
        for g in self.seeds.values():
            out.update(g.drain_refs())
        return out

    # ------------------------------------------------------------------------------------ events
    def count(self, key: str, n: float = 1.0) -> None:
        """Add `n` to this step's lifecycle counter `key` (`events/...`)."""
        self._events[key] = self._events.get(key, 0.0) + n

    def add_member(self, pool: RolloutPool) -> str:
        """Start one more worker in `pool`; it joins the hub and fetches before it takes work."""
        key = pool.group.add()
        pool.state[key] = Member.JOINING
        self._joining[pool.group.members[key].join_run.remote()] = (pool.name, key)
        return key

    def kill_member(self, pool: str, key: str, kill: bool = True) -> None:
        """Forget `key` (and `ray.kill` it unless `kill=False`): no notice, the hub expires it by heartbeat."""
        p = self.pools.get(pool)
        if p is None:
            return
        p.state.pop(key, None)
        p.deadline.pop(key, None)
        h = p.group.members.pop(key, None)
        if kill and h is not None:
            try:
                ray.kill(h, no_restart=True)
            except Exception as e:  # noqa: BLE001 - already dead is fine
                log.debug("kill %s: %s", key, e)

    def on_dead(self, pool: str, key: str) -> bool:
        """A call to `key` failed with RayActorError: forget it. True when this was a planned end (the pool
        killed it: a preemption without notice), False when the worker died on its own (counted)."""
        died = pool in self.pools and key in self.pools[pool].state
        if died:
            self.count("events/died")
        self.kill_member(pool, key, kill=False)
        return not died

    def handle(self, ref, raise_errors: bool = False) -> bool:
        """Consume a ref from `refs()`; False if it is not ours."""
        if ref in self._joining:
            pool, key = self._joining.pop(ref)
            try:
                info = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                if raise_errors:
                    raise
                log.warning("worker %s failed to join: %s", key, e)
                self.count("events/join_failures")
                self.kill_member(pool, key)
                return True
            p = self.pools.get(pool)
            if p is not None and p.state.get(key) == Member.JOINING:
                p.state[key] = Member.READY
                self.ledger.places[info.wid] = Place(kind="peer", dc=info.dc, pool=pool)
                self.count("events/joined")
                log.info("%s joined (hub %s, v%s)", key, info.wid, info.version)
            return True
        if ref in self._leaving:
            pool, key = self._leaving.pop(ref)
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - it goes anyway
                log.warning("worker %s did not leave cleanly: %s", key, e)
            self.kill_member(pool, key)
            self.count("events/left")
            return True
        if ref is self._sync_ref:
            self._sync_ref = None
            try:
                self._apply_requests(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - the registry is a convenience, never fatal
                log.warning("pool registry: %s", e)
            return True
        return False

    def leave_member(self, pool: RolloutPool, key: str, notice_s: float) -> None:
        """Preempt `key` with `notice_s` of notice: no new work; it leaves the hub once its call is back."""
        pool.state[key] = Member.LEAVING
        pool.deadline[key] = time.monotonic() + notice_s

    def poll(self, busy: set[str]) -> None:
        """Start the leave of every leaving worker whose call is back; kill overdue ones; sync the registry."""
        now = time.monotonic()
        started = {k for _, k in self._leaving.values()}
        for name, p in self.pools.items():
            for key, s in list(p.state.items()):
                if s != Member.LEAVING or key in started:
                    continue
                if key not in busy:
                    notice = max(0.0, p.deadline[key] - now)
                    self._leaving[p.group.members[key].shutdown.remote(notice)] = (name, key)
                elif now > p.deadline[key]:
                    log.warning("%s: notice ran out mid-call; killing it", key)
                    self.kill_member(name, key)
                    self.count("events/left")
        for name in [n for n, p in self.pools.items() if p.attached and not p.state]:
            del self.pools[name]  # an attached pool that left entirely
        if self._sync_ref is None and self.registry is not None and now >= self._next_sync:
            self._next_sync = now + SYNC_EVERY_S
            self._sync_ref = self.registry.sync.remote(self.view())

    def view(self) -> dict[str, Any]:
        return {name: {"attached": p.attached, "policy": p.cfg.policy, "dc": p.cfg.location.dc,
                       "rack": p.cfg.location.rack, "workers": {k: v.value for k, v in p.state.items()}} for name, p in self.pools.items()}

    def _apply_requests(self, req: dict[str, Any]) -> None:
        for name, a in req.get("attach", {}).items():
            p = self.pools.get(name)
            if p is not None and not p.attached:
                log.warning("attach of pool %r refused: a configured pool has that name", name)
                continue
            if p is None:
                loc = a["location"]
                pcfg = PoolConfig(size=0)
                pcfg.location.dc, pcfg.location.rack, pcfg.location.host = loc["dc"], loc["rack"], loc.get("host", "")
                p = self.pools[name] = RolloutPool(name, pcfg, self._group(name, pcfg), attached=True)
            for w in a["workers"]:
                try:
                    h = ray.get_actor(w["worker"], namespace=self.namespace)
                except ValueError as e:
                    log.warning("attached worker %s not found: %s", w["worker"], e)
                    continue
                p.group.adopt(w["worker"], h)
                p.state[w["worker"]] = Member.READY
                self.ledger.places[w["wid"]] = Place(kind="peer", dc=w["dc"], pool=name)
                self.count("events/attached")
                log.info("pool %s: adopted %s (hub %s)", name, w["worker"], w["wid"])
        for name in req.get("leave", []):
            p = self.pools.get(name)
            if p is None:
                continue
            for key in list(p.state):
                if p.state[key] != Member.LEAVING:
                    self.leave_member(p, key, notice_s=p.cfg.churn.notice_s)
            log.info("pool %s: asked to leave (%d workers)", name, len(p.state))

    # ------------------------------------------------------------------------------------ per step
    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        """Let every pool's policy act on the step that just closed (churn events, autoscale)."""
        for p in list(self.pools.values()):
            if p.policy is not None:
                p.policy.on_step(self, p, step, metrics)

    def step_metrics(self) -> dict[str, float]:
        """Per-step pool keys: members per pool and this step's lifecycle events (then reset)."""
        out = {f"pool/{n}/members": float(len(p.state)) for n, p in self.pools.items()}
        out.update({f"pool/{n}/ready": float(sum(s == Member.READY for s in p.state.values()))
                    for n, p in self.pools.items()})
        for k in ("events/preemptions", "events/preemptions_notice", "events/preemptions_kill", "events/joins",
                  "events/joined", "events/left", "events/attached", "events/died"):
            out[k] = 0.0
        out.update(self._events)
        self._events = {}
        return out

    # ------------------------------------------------------------------------------------ teardown
    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Every member leaves the hub (no notice) and ends, in parallel; then the seeds and the registry."""
        refs = {}
        for p in self.pools.values():
            for key, h in p.group.members.items():
                refs[h.shutdown.remote()] = h
        for g in self.seeds.values():
            for h in g.members.values():
                refs[h.shutdown.remote()] = h
        if refs:
            ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        for h in refs.values():
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        for p in self.pools.values():
            p.group.members.clear()
            p.state.clear()
        if self.registry is not None:
            ray.kill(self.registry, no_restart=True)
            self.registry = None
        if self.job_file is not None:
            remove_job_files(self.run_dir)
