"""`TrainerGroup`: the trainer ranks as one group the driver trains with, elastic when configured.

    group = TrainerGroup(cfg.trainer, rank_kwargs, run_dir=run_dir, timeout_s=60, num_cpus=0.5)
    group.start(); group.wait_ready(timeout_s)
    refs = group.start_train(payloads, step)       # whole prompt groups split over the current ranks
    metrics = group.finish_train(refs)             # None: a rank was lost and the group re-formed
    group.version                                  # the version the (re-formed) group holds

Static (`trainer.elastic.enabled=false`): a dead rank ends the run (`TrainerGroupError`).
Elastic: when a step fails (a rank's actor died, or a survivor's collective failed or timed out),
the group probes every rank (`alive`, answered from the telemetry concurrency group even while a
rank is stuck in a collective), waits for the survivors' calls to come back (gloo's timeout bounds
that), kills what is left of the lost ones, and re-forms: every member, survivors first (the new
rank 0 is a survivor), `reform`s onto a new port at the new world size and fetches the hub's latest
committed version into its parameters. A worker added mid-run (`trainer.churn.join_at`, or `add()`)
is started in the background and taken in at the first step boundary after it is ready.

Consistency rule (docs/elastic.md): the trainer never publishes a version twice. The re-formed group
holds the latest committed version L (every rank checks the digest of what it loaded), so its next
publish is L + 1; a step whose publish never committed is trained again on the same batch.

Per-step metrics: `trainer/world_size`, `events/trainer_lost`, `events/trainer_joined`,
`timing_s/trainer_recover`. Each re-form is a line of `RUN_DIR/trainer_events.jsonl`.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import ray

from rlsync.workers.elastic import TrainerGroupConfig, split_groups
from rlsync.core.batch import Batch
from rlsync.workers.group import WorkerGroup
from rlsync.workers.trainer_worker import TrainerWorker

log = logging.getLogger(__name__)


class TrainerGroupError(RuntimeError):
    """The trainer group cannot go on (static group lost a rank, too few ranks left, re-form failed)."""


class TrainerGroup:
    def __init__(self, trainer: TrainerGroupConfig, rank_kwargs: dict[str, Any], *, run_dir: str | Path,
                 timeout_s: float, num_cpus: float, checkpoint_dir: Callable[[], str | None] = lambda: None):
        """`rank_kwargs`: what every `TrainerWorker` is built with besides the `trainer` section, its rank and
        port (model, task, seed, sync, shape, hub, setup); `timeout_s`: longest wait for any one call."""
        from rlsync.trainer import free_port

        self.t, self.timeout_s = trainer, timeout_s
        self.elastic = trainer.elastic
        self.churn = trainer.churn
        if (self.churn.kill_at or self.churn.join_at) and not self.elastic.enabled:
            raise ValueError("trainer.churn needs trainer.elastic.enabled=true")
        port, n0 = free_port(), trainer.world_size
        # Initial ranks join the group at `port`; later ones start alone (master_port None).
        self.workers = WorkerGroup("trainer", TrainerWorker,
                                   lambda i: dict(rank_kwargs, trainer=trainer, rank=i,
                                                  master_port=port if i < n0 else None),
                                   num_cpus=num_cpus)
        self.events_path = Path(run_dir) / "trainer_events.jsonl"
        self.checkpoint_dir = checkpoint_dir
        self.version = 0
        self.joining: dict[str, Any] = {}       # key -> ready ref of a worker not yet in the group
        self.hub_ids: dict[str, str] = {}       # key -> hub worker id (every trainer ever, for audits)
        self.last_digest: tuple[int, str] | None = None   # (version, digest) of the last publish seen
        self.recoveries = 0
        self._killed_during: set[int] = set()
        self._window: dict[str, float] = defaultdict(float)

    # ---- what the driver used WorkerGroup for ------------------------------------------------
    @property
    def members(self) -> dict[str, Any]:
        return self.workers.members

    @property
    def world_size(self) -> int:
        return len(self.workers.members)

    def start(self) -> None:
        self.workers.start(self.t.world_size)

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        info = self.workers.wait_ready(timeout_s)
        self.hub_ids.update({k: v["hub_id"] for k, v in info.items() if v.get("hub_id")})
        return info

    def drain_refs(self) -> dict[str, Any]:
        return self.workers.drain_refs()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        for key in list(self.joining):
            self.workers.members[key] = self.joining.pop(key)[0]
        self.workers.shutdown(timeout_s)

    def call(self, method: str, *args_per_rank, timeout_s: float | None = None) -> list:
        """Call `method` on every rank (rank order) and wait; raises TrainerGroupError if a rank fails."""
        handles = list(self.members.values())
        refs = [getattr(h, method).remote(*(a[i] for a in args_per_rank)) for i, h in enumerate(handles)]
        try:
            return ray.get(refs, timeout=timeout_s or self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, ray.exceptions.RayTaskError) as e:
            raise TrainerGroupError(f"trainer group failed in {method}: {e}") from e

    # ---- training --------------------------------------------------------------------------------
    def start_train(self, payloads: list[Batch], step: int, audit: Callable[[Any], Any] = lambda x: x) -> list:
        """Dispatch step `step` (trains version step -> step + 1): take in ready joiners first (a step
        boundary), split the prompt groups over the ranks, inject the churn schedule's kills."""
        self._admit_joiners(wait=self.churn.wait_for_join)
        shards = [audit(Batch.concat(p)) for p in split_groups(payloads, self.world_size)]
        refs = [h.train.remote(s) for h, s in zip(self.members.values(), shards)]
        if step + 1 not in self._killed_during:  # once per step, not again when the step is retried
            self._killed_during.add(step + 1)
            for _ in range(self.churn.kills_during(step + 1)):
                self._inject_kill()
        return refs

    def finish_train(self, refs: list) -> dict[str, float] | None:
        """Mean metrics over ranks; None when the step failed (elastic: the group has re-formed and
        `self.version` says which version it holds; the caller decides whether to train the batch again)."""
        try:
            per_rank = ray.get(refs, timeout=self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, ray.exceptions.RayTaskError) as e:
            if not self.elastic.enabled:
                raise TrainerGroupError(f"trainer group failed in a step: {e}") from e
            log.warning("trainer step failed (%s): re-forming the group", _short(e))
            self._recover(refs)
            return None
        digest = [m.pop("digest") for m in per_rank if "digest" in m]
        self.version = int(per_rank[0]["version"])
        if digest:
            self.last_digest = (self.version, digest[0])
        keys = set.intersection(*(set(m) for m in per_rank))
        return {k: sum(m[k] for m in per_rank) / len(per_rank) for k in keys}

    def after_step(self, step: int) -> None:
        """Step `step` closed: start the workers the churn schedule adds now (they join when ready)."""
        for _ in range(self.churn.joins_after(step)):
            self.add()

    def add(self) -> str:
        """Start one more trainer worker; it is taken into the group at the first step boundary it is ready by."""
        if not self.elastic.enabled:
            raise TrainerGroupError("adding a trainer rank needs trainer.elastic.enabled=true")
        key = self.workers.add()
        handle = self.workers.members.pop(key)
        self.joining[key] = (handle, handle.ready.remote())
        log.info("trainer worker %s starting; it joins the group at a step boundary once ready", key)
        return key

    def step_metrics(self) -> dict[str, float]:
        """This step window's group metrics (events since the last call)."""
        out = {"trainer/world_size": float(self.world_size), "events/trainer_lost": 0.0,
               "events/trainer_joined": 0.0, "timing_s/trainer_recover": 0.0}
        out.update(self._window)
        self._window = defaultdict(float)
        return out

    # ---- elasticity ----------------------------------------------------------------------------
    def _inject_kill(self) -> None:
        keys = list(self.members)
        if len(keys) <= self.elastic.min_world_size:
            log.warning("churn: not killing a trainer rank (group at min_world_size=%d)", self.elastic.min_world_size)
            return
        key = keys[self.churn.kill_rank]
        log.warning("churn: killing trainer worker %s (rank %d) without notice", key, keys.index(key))
        ray.kill(self.members[key], no_restart=True)

    def _admit_joiners(self, wait: bool = False) -> None:
        if wait and self.joining:
            ray.wait([ref for _, ref in self.joining.values()], num_returns=len(self.joining), timeout=self.timeout_s)
        ready = [k for k, (_, ref) in self.joining.items() if ray.wait([ref], timeout=0)[0]]
        if not ready:
            return
        for key in ready:
            handle, ref = self.joining.pop(key)
            try:
                info = ray.get(ref)
            except ray.exceptions.RayError as e:
                log.warning("trainer worker %s failed to start: %s", key, _short(e))
                continue
            self.hub_ids[key] = info.get("hub_id")
            self.members[key] = handle
            self._window["events/trainer_joined"] += 1
            log.info("trainer worker %s joins the group", key)
        self._reform(reason="join")

    def _recover(self, refs: list) -> None:
        """After a failed step: find the survivors, let their calls end, drop the lost, re-form."""
        self.recoveries += 1
        if self.recoveries > self.elastic.max_recoveries:
            raise TrainerGroupError(f"more than {self.elastic.max_recoveries} trainer recoveries")
        t0 = time.perf_counter()
        probes = {k: h.alive.options(concurrency_group="telemetry").remote() for k, h in self.members.items()}
        lost = []
        for key, ref in probes.items():
            try:
                ray.get(ref, timeout=self.elastic.ping_timeout_s)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                lost.append(key)
        # Survivors' step calls end by themselves: a dead peer closes the gloo connections, and the
        # group's collective timeout bounds a rank that waits on one anyway.
        by_key = dict(zip(self.members, refs))
        alive_refs = [by_key[k] for k in self.members if k not in lost and k in by_key]
        stuck = []
        if alive_refs:
            _, stuck = ray.wait(alive_refs, num_returns=len(alive_refs), timeout=self.elastic.collective_timeout_s + 30)
        for key, ref in by_key.items():
            if ref in stuck:
                lost.append(key)
        for key in lost:
            log.warning("trainer worker %s lost", key)
            try:
                ray.kill(self.members.pop(key), no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._window["events/trainer_lost"] += len(lost)
        self._reform(reason="loss", lost=lost, started=t0)

    def _reform(self, reason: str, lost: list[str] = (), started: float | None = None) -> None:
        from rlsync.trainer import free_port

        t0 = started if started is not None else time.perf_counter()
        n = self.world_size
        if n < max(1, self.elastic.min_world_size):
            raise TrainerGroupError(f"trainer group down to {n} ranks (min_world_size={self.elastic.min_world_size})")
        port = free_port()
        ckpt = self.checkpoint_dir() if self.elastic.optimizer_state == "checkpoint" else None
        keys = list(self.members)
        log.info("re-forming the trainer group (%s): %d ranks %s on port %d", reason, n, keys, port)
        try:
            res = self.call("reform", list(range(n)), [n] * n, [port] * n, [ckpt] * n,
                            timeout_s=self.elastic.collective_timeout_s + 120)
        except TrainerGroupError as e:
            if "VersionLostError" in str(e):
                raise TrainerGroupError(
                    "the latest committed version has no live replica left (its only holder was the lost "
                    "rank, and no rollout worker had fetched it yet): run a seed worker that follows latest "
                    f"(hub.seed_dcs=[{self.t.location.dc}]); docs/elastic.md") from e
            raise
        versions = {r["version"] for r in res}
        digests = {r["digest"] for r in res}
        if len(versions) != 1 or len(digests) != 1:
            raise TrainerGroupError(f"re-formed ranks disagree: versions {versions}, {len(digests)} digests")
        self.version = versions.pop()
        if res[0]["latest"] != self.version:
            raise TrainerGroupError(f"re-formed at v{self.version} but the hub's latest is v{res[0]['latest']}")
        took = time.perf_counter() - t0
        self._window["timing_s/trainer_recover"] += took
        trainer_ids = {v for v in self.hub_ids.values() if v}
        # A rank fetching in this re-form is a relay the hub may plan another rank on: bytes it forwards
        # came from the hub's replicas through it, not from a trainer's own copy (a rank reading its own
        # backup replica is its own copy).
        ids = [self.hub_ids.get(k) for k in keys]
        relays = {ids[i] for i, r in enumerate(res) if r["bytes_by_source"]}
        relayed = sum(b for i, r in enumerate(res) for w, b in r["bytes_by_source"].items()
                      if w in relays and w != ids[i])
        event = {"event": reason, "time": time.time(), "world_size": n, "members": keys, "lost": list(lost),
                 "version": self.version, "digest": next(iter(digests)),
                 "published_digest": self.last_digest[1] if self.last_digest and self.last_digest[0] == self.version else None,
                 "optimizer": sorted({r["optimizer"] for r in res}), "seconds": took,
                 "bytes_by_source": [r["bytes_by_source"] for r in res],
                 "from_trainers": sum(b for r in res for w, b in r["bytes_by_source"].items() if w in trainer_ids) - relayed,
                 "relayed_by_ranks": relayed}
        with self.events_path.open("a") as f:
            f.write(json.dumps(event) + "\n")
        log.info("trainer group re-formed at world size %d in %.2fs: version %d from the hub (%s)",
                 n, took, self.version, {w: b for r in res for w, b in r["bytes_by_source"].items()})


def _short(e: BaseException) -> str:
    """The exception's own message: for a task error, the last line of the remote traceback."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return lines[-1].strip()[:300] if lines else type(e).__name__
