"""Rollout pools: named elastic worker groups with a location and a policy; seeds; the attach registry.

A pool (`pools.<name>` in the config, or attached to a running job with `python -m rlsync.pool join`)
is a `WorkerGroup` of `RolloutWorker`s plus each member's lifecycle state:

    joining -> the actor starts, joins the hub and fetches `latest` (`RolloutWorker.join_run`: the
               planner prefers peers near it over the trainer);
    ready   -> the driver hands it prompts;
    leaving -> preempted with notice, shrunk, or its pool asked to leave: no new work; once its call
               is back it runs `hub.leave(deadline_s=notice)` (retention hands off what only it holds),
               then the actor ends;
    gone    -> killed without notice (`ray.kill`: the hub expires it by heartbeat), died, or left.

Policies (`pools.<name>.policy`): `fixed`; `spot` (a seeded `ChurnSchedule` preempts and adds workers
after given steps); `autoscale` (one worker more or less per cooldown, from the step's stall numbers).

`PoolSet` is what the driver talks to, and it never blocks: joins and leaves are Ray refs that the
driver's `ray.wait` includes (`refs()`, then `handle(ref)`). It also runs one seed worker per DC in
`hub.seed_dcs`, and the job's `PoolRegistry` (a named actor in the job's Ray namespace) through which
`python -m rlsync.pool` attaches and detaches pools: the CLI starts named detached actors, has them
fetch, and registers them; the driver polls the registry about once a second and adopts them.
`RUN_DIR/job.json` (mode 0600: it holds the hub token) tells the CLI where the Ray cluster, the
namespace and the hub are.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ray

from rlsync.churn import JOIN, PREEMPT_KILL, PREEMPT_NOTICE, ChurnSchedule, autoscale_delta
from rlsync.config import PoolConfig, TrainConfig, as_dict
from rlsync.sources import Place, SourceLedger
from rlsync.stall import StallClock
from rlsync.workers import RolloutWorker, WorkerGroup, _process_setup, _telemetry

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
LAST_JOB = Path(os.path.expanduser("~/.cache/rlsync/last_job"))
REGISTRY = "registry"
POLICIES = ("fixed", "spot", "autoscale")
SYNC_EVERY_S = 1.0


# ---------------------------------------------------------------------------------- job file

def write_job_file(run_dir: Path, info: dict[str, Any]) -> Path:
    """Atomically write RUN_DIR/job.json readable only by this user (it carries the hub token)."""
    path = Path(run_dir) / JOB_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f, default=str)
    os.chmod(tmp, 0o600)  # O_CREAT's mode is filtered by the umask; be explicit
    os.replace(tmp, path)
    try:
        LAST_JOB.parent.mkdir(parents=True, exist_ok=True)
        LAST_JOB.write_text(str(path.resolve()))
    except OSError as e:
        log.debug("could not record the last job: %s", e)
    return path


def _ray_auth_token() -> str | None:
    """The Ray token this process uses (Ray 2.60's token auth): a CLI started elsewhere presents the same."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"]
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    return path.read_text().strip() if path.exists() else None


def read_job_file(job: str | os.PathLike | None) -> dict[str, Any]:
    """The job file of RUN_DIR `job` (or of $RLSYNC_JOB, or of the job started last on this machine)."""
    if job is None:
        job = os.environ.get("RLSYNC_JOB") or (LAST_JOB.read_text().strip() if LAST_JOB.exists() else None)
    if job is None:
        raise FileNotFoundError("no job given: pass --job RUN_DIR (or set RLSYNC_JOB)")
    path = Path(job)
    if path.is_dir():
        path = path / JOB_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: no job file; is the job running? (a job writes it at start-up "
                                "and removes it when it ends)")
    if path.stat().st_mode & 0o077:
        raise PermissionError(f"{path} is readable by others (mode {oct(path.stat().st_mode & 0o777)}): "
                              "it holds the hub token; refusing to use it")
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------- actors

class PoolRegistry:
    """The job's pool board: the driver reports its pools; the CLI asks to attach or detach pools."""

    def __init__(self) -> None:
        self.view: dict[str, Any] = {}
        self.reported = 0.0
        self.attach_requests: dict[str, dict] = {}
        self.leave_requests: set[str] = set()

    def sync(self, view: dict[str, Any]) -> dict[str, Any]:
        """Driver: publish the pools' states; take the pending attach / leave requests."""
        self.view, self.reported = view, time.time()
        out = {"attach": self.attach_requests, "leave": sorted(self.leave_requests)}
        self.attach_requests, self.leave_requests = {}, set()
        return out

    def attach(self, pool: str, workers: list[dict], location: dict) -> None:
        req = self.attach_requests.setdefault(pool, {"workers": [], "location": location})
        req["workers"].extend(workers)

    def request_leave(self, pool: str) -> None:
        self.leave_requests.add(pool)

    def snapshot(self) -> dict[str, Any]:
        return {"pools": self.view, "reported_s_ago": time.time() - self.reported if self.reported else None,
                "pending_attach": sorted(self.attach_requests), "pending_leave": sorted(self.leave_requests)}


@_telemetry
class SeedWorker:
    """A seed worker for one DC (`role="seed", follow=True`): keeps `latest` there, takes hand-offs.

    The hub client fetches in its own thread; this actor records each of those fetches as a `fetch`
    event so the bytes it pulls (the DC crossing) show in `sync/*` like every reader's.
    """

    def __init__(self, cfg: TrainConfig, dc: str, hub_address: str, hub_token: str):
        _process_setup(cfg)
        from rlsync.hub import ClientConfig, HubClient, Location

        self.worker_id = f"seed-{dc}"
        self.clock = StallClock(self.worker_id, role="seed", pool=self.worker_id)
        self.hub = HubClient(hub_address, token=hub_token, config=ClientConfig(transport=cfg.hub.transport))
        fetch = self.hub.fetch

        def recorded_fetch(*a, **kw):  # the hub exposes no per-fetch hook for seed workers (see docs/rl.md)
            got = fetch(*a, **kw)
            self.clock.event("fetch", version=got.version, bytes=got.nbytes, seconds=got.seconds,
                             sources=sorted(got.bytes_by_source), bytes_by_source=dict(got.bytes_by_source),
                             transports=sorted(set(got.transports.values())), wid=self.hub.worker_id, dc=dc)
            return got

        self.hub.fetch = recorded_fetch
        self.hub.join(Location(dc=dc, rack="seed", host=self.worker_id), name=self.worker_id, role="seed",
                      follow=True)

    def info(self) -> dict[str, Any]:
        return {"worker": self.worker_id, "wid": self.hub.worker_id, "dc": self.hub.location.dc}

    def shutdown(self, deadline_s: float = 0.0) -> None:
        self.hub.leave(deadline_s=deadline_s)


# ---------------------------------------------------------------------------------- pools

def rollout_group(cfg: TrainConfig, name: str, hub_address: str, hub_token: str, first_index: int = 0) -> WorkerGroup:
    """The `WorkerGroup` of pool `name` (`cfg.pools[name]` must exist: its workers read their location there)."""
    return WorkerGroup(name, RolloutWorker, lambda i: (cfg, name, i, hub_address, hub_token),
                       num_cpus=cfg.ray.actor_num_cpus, first_index=first_index)


@dataclass
class RolloutPool:
    name: str
    cfg: PoolConfig
    group: WorkerGroup
    attached: bool = False
    """Attached from another terminal (`python -m rlsync.pool join`): its actors are named and detached."""
    state: dict[str, str] = field(default_factory=dict)
    """worker key -> joining | ready | leaving."""
    deadline: dict[str, float] = field(default_factory=dict)
    """leaving worker key -> monotonic time its notice runs out."""
    schedule: ChurnSchedule | None = None
    deferred: list[str] = field(default_factory=list)
    """Preemptions that could not happen yet (the pool at min_size, or no ready worker): retried each step."""
    last_resize: int = -(10**9)

    def live(self) -> list[str]:
        """Members that are or will be useful (joining or ready)."""
        return [k for k, s in self.state.items() if s in ("joining", "ready")]

    @property
    def max_size(self) -> int:
        return self.cfg.max_size or self.cfg.size


class PoolSet:
    def __init__(self, cfg: TrainConfig, hub_address: str, hub_token: str, run_dir: Path):
        self.cfg, self.addr, self.tok, self.run_dir = cfg, hub_address, hub_token, Path(run_dir)
        for name, p in cfg.pools.items():
            if p.policy not in POLICIES:
                raise ValueError(f"pools.{name}.policy={p.policy!r}; known: {', '.join(POLICIES)}")
            if p.policy != "spot" and (p.churn.preemptions or p.churn.joins):
                raise ValueError(f"pools.{name}.churn is set but policy={p.policy!r}: churn needs policy=spot")
        self.namespace = f"rlsync-{secrets.token_hex(6)}"
        self.pools: dict[str, RolloutPool] = {}
        self.seeds: dict[str, WorkerGroup] = {}
        self.ledger = SourceLedger(trainer_dc=cfg.trainer.location.dc)
        self._joining: dict[Any, tuple[str, str]] = {}
        self._leaving: dict[Any, tuple[str, str]] = {}
        self._events: dict[str, float] = {}
        self._sync_ref = None
        self._next_sync = 0.0
        self.registry = None
        self.job_file: Path | None = None

    # ------------------------------------------------------------------------------------ set-up
    def _group(self, name: str) -> WorkerGroup:
        return rollout_group(self.cfg, name, self.addr, self.tok)

    def start(self) -> None:
        """Start every configured pool's workers, the seed workers and the registry (asynchronous)."""
        c = self.cfg
        for name, p in c.pools.items():
            if p.policy == "fixed" and p.size == 0:
                continue  # a default pool a recipe switched off (`pools.main.size: 0`)
            pool = RolloutPool(name, p, self._group(name))
            if p.policy == "spot":
                pool.schedule = ChurnSchedule.build(p.churn, name, c.steps)
            self.pools[name] = pool
            for _ in range(p.size):
                self._add(pool)
        for dc in c.hub.seed_dcs:
            g = WorkerGroup(f"seed-{dc}", SeedWorker, lambda i, dc=dc: (c, dc, self.addr, self.tok),
                            num_cpus=min(0.25, c.ray.actor_num_cpus))
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

    def write_job_file(self) -> Path:
        info = {"ray_address": ray.get_runtime_context().gcs_address, "namespace": self.namespace,
                "hub_address": self.addr, "hub_token": self.tok, "model": self.cfg.hub.model_name,
                "run_dir": str(self.run_dir.resolve()), "driver_pid": os.getpid(), "ray_auth_mode": os.environ.get("RAY_AUTH_MODE"),
                "ray_auth_token": _ray_auth_token(),
                "config": json.loads(json.dumps(as_dict(self.cfg), default=str))}
        self.job_file = write_job_file(self.run_dir, info)
        return self.job_file

    # ------------------------------------------------------------------------------------ queries
    def free(self, busy: set[str]) -> Iterator[tuple[str, str, Any]]:
        """(pool, key, handle) of ready workers without a call in flight."""
        for name, p in self.pools.items():
            for key, s in list(p.state.items()):
                if s == "ready" and key not in busy:
                    yield name, key, p.group.members[key]

    def ready_count(self) -> int:
        return sum(s == "ready" for p in self.pools.values() for s in p.state.values())

    def alive(self) -> bool:
        return any(p.live() for p in self.pools.values())

    def refs(self) -> list:
        return [*self._joining, *self._leaving, *([self._sync_ref] if self._sync_ref is not None else [])]

    def drain_refs(self) -> dict[str, Any]:
        """Stall-record refs of every member that answers now (not the ones still starting) and of seeds."""
        out = {}
        for p in self.pools.values():
            for key, s in p.state.items():
                if s != "joining" and key in p.group.members:
                    out[key] = p.group.members[key].drain_stall.options(concurrency_group="telemetry").remote()
        for g in self.seeds.values():
            out.update(g.drain_refs())
        return out

    # ------------------------------------------------------------------------------------ events
    def _count(self, key: str, n: float = 1.0) -> None:
        self._events[key] = self._events.get(key, 0.0) + n

    def _add(self, pool: RolloutPool) -> str:
        key = pool.group.add()
        pool.state[key] = "joining"
        self._joining[pool.group.members[key].join_run.remote()] = (pool.name, key)
        return key

    def _gone(self, pool: str, key: str, kill: bool = True) -> None:
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

    def on_dead(self, pool: str, key: str) -> None:
        """A call to `key` failed with RayActorError: forget it."""
        if pool in self.pools and key in self.pools[pool].state:
            self._count("events/died")
        self._gone(pool, key, kill=False)

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
                self._count("events/join_failures")
                self._gone(pool, key)
                return True
            p = self.pools.get(pool)
            if p is not None and p.state.get(key) == "joining":
                p.state[key] = "ready"
                self.ledger.places[info["wid"]] = Place(kind="peer", dc=info["dc"], pool=pool)
                self._count("events/joined")
                log.info("%s joined (hub %s, v%s)", key, info["wid"], info["version"])
            return True
        if ref in self._leaving:
            pool, key = self._leaving.pop(ref)
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - it goes anyway
                log.warning("worker %s did not leave cleanly: %s", key, e)
            self._gone(pool, key)
            self._count("events/left")
            return True
        if ref is self._sync_ref:
            self._sync_ref = None
            try:
                self._apply_requests(ray.get(ref))
            except Exception as e:  # noqa: BLE001 - the registry is a convenience, never fatal
                log.warning("pool registry: %s", e)
            return True
        return False

    def _leave(self, pool: RolloutPool, key: str, notice_s: float) -> None:
        pool.state[key] = "leaving"
        pool.deadline[key] = time.monotonic() + notice_s

    def poll(self, busy: set[str]) -> None:
        """Start the leave of every leaving worker whose call is back; kill overdue ones; sync the registry."""
        now = time.monotonic()
        started = {k for _, k in self._leaving.values()}
        for name, p in self.pools.items():
            for key, s in list(p.state.items()):
                if s != "leaving" or key in started:
                    continue
                if key not in busy:
                    notice = max(0.0, p.deadline[key] - now)
                    self._leaving[p.group.members[key].shutdown.remote(notice)] = (name, key)
                elif now > p.deadline[key]:
                    log.warning("%s: notice ran out mid-call; killing it", key)
                    self._gone(name, key)
                    self._count("events/left")
        for name in [n for n, p in self.pools.items() if p.attached and not p.state]:
            del self.pools[name]  # an attached pool that left entirely
        if self._sync_ref is None and self.registry is not None and now >= self._next_sync:
            self._next_sync = now + SYNC_EVERY_S
            self._sync_ref = self.registry.sync.remote(self.view())

    def view(self) -> dict[str, Any]:
        return {name: {"attached": p.attached, "policy": p.cfg.policy, "dc": p.cfg.location.dc,
                       "rack": p.cfg.location.rack, "workers": dict(p.state)} for name, p in self.pools.items()}

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
                p = self.pools[name] = RolloutPool(name, pcfg, self._group(name), attached=True)
            for w in a["workers"]:
                try:
                    h = ray.get_actor(w["worker"], namespace=self.namespace)
                except ValueError as e:
                    log.warning("attached worker %s not found: %s", w["worker"], e)
                    continue
                p.group.adopt(w["worker"], h)
                p.state[w["worker"]] = "ready"
                self.ledger.places[w["wid"]] = Place(kind="peer", dc=w["dc"], pool=name)
                self._count("events/attached")
                log.info("pool %s: adopted %s (hub %s)", name, w["worker"], w["wid"])
        for name in req.get("leave", []):
            p = self.pools.get(name)
            if p is None:
                continue
            for key in list(p.state):
                if p.state[key] != "leaving":
                    self._leave(p, key, notice_s=p.cfg.churn.notice_s)
            log.info("pool %s: asked to leave (%d workers)", name, len(p.state))

    # ------------------------------------------------------------------------------------ per step
    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        """Run the churn schedule's events for `step` and the autoscale rule."""
        for name, p in self.pools.items():
            if p.schedule is not None:
                kinds, p.deferred = [*p.deferred, *(ev.kind for ev in p.schedule.at(step))], []
                for kind in kinds:
                    self._churn(p, kind)
            if p.cfg.policy == "autoscale" and step - p.last_resize >= p.cfg.autoscale.cooldown_steps:
                window = metrics.get("stall/window_s", 0.0)
                ranks = metrics.get("pool/trainer/workers", 1.0) or 1.0
                wait = metrics.get("stall/trainer_wait_data_s", 0.0) / (window * ranks) if window > 0 else None
                d = autoscale_delta(p.cfg.autoscale, size=len(p.live()), min_size=p.cfg.min_size,
                                    max_size=p.max_size, trainer_wait_data_ratio=wait,
                                    rollout_idle_ratio=metrics.get(f"pool/{name}/idle_ratio"))
                if d > 0:
                    self._add(p)
                    self._count("events/joins")
                elif d < 0:
                    self._leave(p, sorted(p.live())[-1], notice_s=p.cfg.churn.notice_s)
                    self._count("events/shrinks")
                if d:
                    p.last_resize = step

    def _churn(self, p: RolloutPool, kind: str) -> None:
        if kind == JOIN:
            if len(p.live()) >= p.max_size:
                self._count("events/joins_skipped")
                return
            key = self._add(p)
            self._count("events/joins")
            log.info("churn: %s joins pool %s", key, p.name)
            return
        ready = [k for k, s in p.state.items() if s == "ready"]
        if len(p.live()) - 1 < p.cfg.min_size or self.ready_count() - 1 < 1 or not ready:
            p.deferred.append(kind)  # it would leave the pool (or the run) without a worker: later
            return
        victim = p.schedule.pick_victim(ready)
        self._count("events/preemptions")
        if kind == PREEMPT_KILL:
            log.info("churn: %s preempted without notice (killed)", victim)
            self._count("events/preemptions_kill")
            self._gone(p.name, victim)
        elif kind == PREEMPT_NOTICE:
            log.info("churn: %s preempted with %.0fs notice", victim, p.cfg.churn.notice_s)
            self._count("events/preemptions_notice")
            self._leave(p, victim, p.cfg.churn.notice_s)

    def step_metrics(self) -> dict[str, float]:
        """Per-step pool keys: members per pool and this step's lifecycle events (then reset)."""
        out = {f"pool/{n}/members": float(len(p.state)) for n, p in self.pools.items()}
        out.update({f"pool/{n}/ready": float(sum(s == "ready" for s in p.state.values()))
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
            self.job_file.unlink(missing_ok=True)
