"""The driver: the RL loop between a trainer group and rollout pools, with weights only in the hub.

    summary = Driver(TrainConfig(steps=20), run_dir="runs/r1").run()

What one process does (DESIGN.md §4):
1. joins or starts a Ray cluster, starts the embedded hub in this process, the trainer group (N data-parallel ranks)
   and every rollout pool (M workers each);
2. the trainer publishes version v (its live tensors; the hub copies nothing); rollout workers fetch `latest` into
   their engines' parameters when the staleness bound requires it;
3. event loop: hand free workers prompts as the schedule says (schedule.py), buffer the scored groups, and whenever
   the trainer is free and the buffer holds a batch the bound admits for this step (older ones dropped), train;
4. per step: drain every worker's stall clock, aggregate the window (`StepAggregator`), log it and a few completions'
   text (JSONL/wandb), append to `trace.json`, move the progress bar, checkpoint on cadence.

Weights never pass through Ray or the driver: calls carry prompts, scored samples and metrics; every tensor sent or
received is counted (`ray/payload_bytes`) and checked against the parameter shapes (`ray/weight_like_tensors`: 0).
Rollout pools are elastic (rlsync/pool/pool_set.py): a `PoolSet` starts them, runs their churn schedules and
autoscale rule after each step, adopts pools attached with `python -m rlsync.pools join`, and turns joins and leaves
into refs this loop waits on with the rest, so the loop never blocks on one worker.

The trainer ranks are a `TrainerGroup` (rlsync/workers/trainer_group.py), static by default: a dead rank ends the run.
With `trainer.elastic.enabled=true` a failed step re-forms the group at the new world size from the hub's latest
committed weights and the loop trains the same batch again (or counts the step if it committed); ranks added mid-run
join at a step boundary (docs/elastic.md). Simplified: a dead rollout worker is dropped, its prompts lost (counted).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray
import torch

from rlsync.config.compose import check_config, hub_access, rollout_kwargs, route_of, trainer_kwargs, with_plugins
from rlsync.config.schema import TrainConfig, as_dict
from rlsync.core.stall import now_ns
from rlsync.driver.audit import PayloadAudit
from rlsync.driver.checkpoint import CheckpointStore
from rlsync.driver.schedule import AsyncSchedule, LockstepSchedule, Request
from rlsync.driver.staleness import SampleBuffer, StalenessBound
from rlsync.driver.teardown import run_all
from rlsync.pool.attach import ray_connect_hint
from rlsync.pool.pool_set import PoolSet
from rlsync.telemetry.completions import CompletionSample, trained_prompts
from rlsync.telemetry.metrics import HubStats, StepAggregator
from rlsync.telemetry.record import RunRecord
from rlsync.telemetry.progress import StepProgress
from rlsync.telemetry.trace import TraceWriter
from rlsync.workers.policy import build_policy
from rlsync.workers.group import write_peak_rss
from rlsync.workers.trainer_group import TrainerGroup, TrainerGroupError
from rlsync.driver.evaluation import Evaluator

log = logging.getLogger(__name__)


class RunError(RuntimeError):
    """The run cannot go on (a trainer rank died, no rollout worker is left, a call timed out)."""


def _first_line(e: BaseException) -> str:
    """A Ray error's first line (its str() carries the remote traceback; the run's log keeps that at debug)."""
    cause = getattr(e, "cause", None)  # RayTaskError: the exception raised inside the worker
    text = f"{type(cause).__name__}: {cause}" if isinstance(cause, BaseException) else str(e)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


class Driver:
    def __init__(self, cfg: TrainConfig, run_dir: str | os.PathLike):
        # Absolute: workers (their log files go under the run dir) run in other directories.
        run_dir = Path(cfg.run_dir or run_dir).resolve()
        self.cfg = check_config(with_plugins(dataclasses.replace(cfg, run_dir=str(run_dir))))
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.bound = StalenessBound(cfg.rollout.max_staleness, cfg.rollout.max_off_policy_versions)
        self.n_rollout = sum(p.size for p in cfg.pools.values())
        r = cfg.rollout
        self.ppr = r.prompts_per_request or max(1, -(-r.prompts_per_step // max(1, self.n_rollout)))
        size = dict(prompts_per_step=r.prompts_per_step, per_request=self.ppr, total_steps=cfg.steps,
                    samples=cfg.logging.completions_per_step)
        self.schedule = (LockstepSchedule(run_seed=cfg.seed, **size) if cfg.deterministic  # schedule.py
                         else AsyncSchedule(self.bound, **size))
        self._stop_requested = threading.Event()
        self.evals = Evaluator(cfg.eval, model=cfg.model, task=cfg.task, steps=cfg.steps, timeout_s=cfg.timeout_s)
        self.looping = False  # True once the step loop runs: stop() then ends the run at its next turn
        self.signal_handlers: dict[int, Any] = {}  # put back after ray.init (it sets SIGTERM's): GracefulStop

    def stop(self) -> None:
        """Ask a running `run()` to end at the step boundary (thread-safe): a step training finishes and counts,
        then a checkpoint (`checkpoint.enabled`; `resume=auto` continues there) and the usual shut-down."""
        self._stop_requested.set()

    # ------------------------------------------------------------------------------------ set-up
    def _start(self) -> None:
        from rlsync.hub import start_embedded_hub

        c = self.cfg
        if not ray.is_initialized():
            kw = dict(include_dashboard=False, log_to_driver=True)
            if c.ray.address:
                try:
                    ray.init(address=c.ray.address, **kw)
                except ConnectionError as e:
                    raise ConnectionError(ray_connect_hint(c.ray.address, e)) from e
            else:
                ray.init(num_cpus=c.ray.num_cpus, **kw)
            for sig, handler in self.signal_handlers.items():
                signal.signal(sig, handler)
        # A fresh journal per run (a resumed run re-publishes its checkpoint's version, which an old journal would
        # refuse as not increasing), in a temp dir of the driver's own, removed in _stop (also after Ctrl-C).
        self._hub_tmp = tempfile.mkdtemp(prefix="rlsync-hub-")
        self.hub = start_embedded_hub(host=c.hub.host, config=c.hub.server,
                                      journal=os.path.join(self._hub_tmp, "journal.db"))
        hub = hub_access(c, self.hub.address, self.hub.token)
        ckpt = CheckpointStore(self.run_dir / "checkpoints", keep=c.checkpoint.keep)
        self.channels = route_of(c).coordinator(c.sync, hub.address, c.timeout_s)  # before any worker looks for it
        self.trainers = TrainerGroup(c.trainer, trainer_kwargs(c, hub), run_dir=self.run_dir, timeout_s=c.timeout_s,
                                     num_cpus=c.ray.actor_num_cpus,
                                     checkpoint_dir=lambda: str(ckpt.latest()[0]) if ckpt.latest() else None)
        self.trainers.start()
        self.pools = PoolSet(c.pools, rollout_kwargs(c, hub), run_dir=self.run_dir, steps=c.steps,
                             seed_dcs=c.hub.seed_dcs, trainer_dc=c.trainer.location.dc, num_cpus=c.ray.actor_num_cpus)
        self.pools.start()
        info = self.trainers.wait_ready(c.timeout_s)
        self.audit = PayloadAudit(next(iter(info.values()))["shapes"])
        self.pools.wait_ready(c.timeout_s)
        self.pools.write_job_file(as_dict(c))
        self.channels.start(self.trainers, self.pools, c.timeout_s)

    def _stop(self) -> None:
        if getattr(self, "channels", None) is not None:
            try:
                self.channels.check(timeout_s=30.0)
            except Exception as e:  # noqa: BLE001 - shutting down anyway
                log.warning("weight channel: %s", e)
        # Start-up cut short (Ctrl-C): workers still importing have nothing to hand off; do not wait 10 s on each.
        grace = 10.0 if self.looping else 1.0
        groups = [g for g in (getattr(self, "pools", None), getattr(self, "trainers", None)) if g is not None]
        closers = [o for o in (getattr(self, "_stats_client", None),) if o is not None]
        tmp = getattr(self, "_hub_tmp", None)
        run_all([functools.partial(g.shutdown, timeout_s=grace) for g in groups] + [o.close for o in closers]
                + ([self.hub.stop] if getattr(self, "hub", None) is not None else [])
                + ([functools.partial(shutil.rmtree, tmp, ignore_errors=True)] if tmp is not None else []))

    def _write_memory(self) -> None:
        """Peak RSS of every live worker to <run dir>/memory.json (docs/real_model.md: copies per worker)."""
        groups = [getattr(getattr(self, "trainers", None), "workers", None)]
        groups += [p.group for p in getattr(getattr(self, "pools", None), "pools", {}).values()]
        write_peak_rss([g for g in groups if g is not None], self.run_dir / "memory.json")

    def _trainer_call(self, method: str, *args_per_rank) -> list:
        try:
            return self.trainers.call(method, *args_per_rank)
        except TrainerGroupError as e:
            raise RunError(str(e)) from e

    def _hub_stats(self) -> HubStats | None:
        from rlsync.hub import HubClient

        try:
            if getattr(self, "_stats_client", None) is None:
                # A control-plane client that never joins: the driver holds no replica, serves no bytes.
                self._stats_client = HubClient(self.hub.address, token=self.hub.token, config=self.cfg.hub.client)
            s = self._stats_client.stats()
        except Exception as e:  # noqa: BLE001 - metrics must not end the run
            log.warning("hub stats: %s", e)
            return None
        m = s.get("models", {}).get(self.cfg.hub.model_name, {})
        load = {k: float(s[k]) for k in ("plan_ms", "plan_ms_p99", "rpc_per_s", "heartbeat_lag_ms") if k in s}
        return HubStats(replicas=int(s["replicas"]), retained_versions=len(m.get("retained", [])), **load)

    # ------------------------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        c = self.cfg
        _, self.task = build_policy(c.model, c.task, c.seed, tokenizer_only=True)
        ckpt = CheckpointStore(self.run_dir / "checkpoints", keep=c.checkpoint.keep)
        resumed = ckpt.resolve(c.resume)
        from_step = int(resumed[1]["step"]) if resumed is not None else None
        record = RunRecord(self.run_dir, c.logging, as_dict(c), resumed_from_step=from_step)  # resumed: continued
        logger, trace = record.logger, record.trace
        self.totals = defaultdict(float)
        try:
            self._start()
            step = 0
            if resumed is not None:
                path, state = resumed
                versions = self._trainer_call("load_checkpoint", [str(path)] * c.trainer.world_size)
                step = int(state["step"])
                if versions[0] != step:
                    raise RunError(f"checkpoint {path}: trainer version {versions[0]} != driver step {step}")
                self.task.load_state_dict(state["task"])
                self.totals.update(state.get("totals", {}))
                log.info("resumed from %s at step %d (data cursor %d)", path, step, self.task.cursor)
            self._trainer_call("publish")
            self.channels.after_publish(wait=True)
            self.evals.run(self, step, logger)
            with StepProgress(total=c.steps, enabled=c.progress) as bar:
                bar.update(step, version=step)
                self._loop(step, logger, trace, bar, ckpt)
        finally:
            record.close(last_step=int(self.totals.get("steps", from_step or 0)))
            if self.looping:  # not after a start-up cut short: workers still importing hold each ask 30 s
                self._write_memory()
            self._stop()
        return dict(self.totals)

    def _loop(self, step: int, logger, trace: TraceWriter, bar: StepProgress, ckpt: CheckpointStore) -> None:
        c, r = self.cfg, self.cfg.rollout
        buf: SampleBuffer = SampleBuffer()
        pending: dict[Any, Request] = {}  # ref -> (pool, worker key, prompts)
        busy: set[str] = set()
        inflight = 0
        train_refs: list | None = None
        train_started = 0.0
        agg = StepAggregator()
        step_start_ns = agg.window_start_ns
        step_stats: dict[str, float] = defaultdict(float)
        texts = CompletionSample(c.logging.completions_per_step)  # completions.jsonl, wandb table
        last_progress = time.monotonic()
        self.looping = True
        while step < c.steps and not (self._stop_requested.is_set() and train_refs is None):  # see stop()
            # 0. pools: start leaves of preempted workers whose call is back, adopt attached pools
            self.pools.poll(busy)
            # 1. hand out prompts to free workers, as the schedule says (async: never more than k versions ahead)
            for ref, req in ([] if self._stop_requested.is_set() else self.schedule.hand_out(
                    step, train_refs is not None, buf, inflight, busy, self.pools, self.task, self.channels)):
                pending[ref] = req
                busy.add(req.key)
                inflight += len(req.prompts)
            # 2. start a train step when the trainer is free and a fresh batch is buffered
            if train_refs is None and not self._stop_requested.is_set():
                took = buf.take(step, r.prompts_per_step, self.bound)
                for k, v in took.metrics(step).items():  # dropped, generated; mean and max of the batch taken
                    step_stats[k] += v
                if took.payloads:
                    self._batch = took.payloads  # kept: a step lost with a trainer rank is trained again
                    train_refs, train_started = self._start_train(step), time.monotonic()
                    rewards = torch.cat([b.rewards for b in took.payloads])
                    step_stats["reward/mean"] = float(rewards.mean())
                    step_stats["reward/max_group_mean"] = max(float(b.rewards.mean()) for b in took.payloads)
            # 3. wait for whichever call finishes first (never blocking on one worker)
            refs = list(pending) + (train_refs or []) + self.pools.refs()
            ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
            if not ready:
                if time.monotonic() - last_progress > c.timeout_s:
                    raise RunError(f"no worker call finished in {c.timeout_s:.0f}s (timeout_s)")
                continue
            ref = ready[0]
            if self.pools.handle(ref):
                continue
            last_progress = time.monotonic()
            if ref in pending:
                req = pending.pop(ref)
                pool, key, n = req.pool, req.key, len(req.prompts)
                busy.discard(key)
                inflight -= n
                try:
                    res = self.audit.see(ray.get(ref))
                except ray.exceptions.RayActorError as e:
                    n = self.schedule.lost(req)  # lockstep: handed out again (0 lost)
                    if self.pools.on_dead(pool, key):  # a planned preemption: one line, no Ray traceback
                        log.info("%s preempted mid-call: %d prompts lost", key, n)
                    else:
                        log.warning("rollout worker %s died (%s): %d prompts lost", key, _first_line(e), n)
                    self.totals["pool/lost_prompts"] += n
                    if not self.pools.alive():
                        raise RunError("every rollout worker is gone") from e
                    continue
                except ray.exceptions.RayTaskError as e:
                    n = self.schedule.lost(req)
                    log.warning("rollout on %s failed: %s; %d prompts lost", key, _first_line(e), n)
                    log.debug("rollout on %s failed", key, exc_info=e)
                    self.totals["pool/lost_prompts"] += n
                    self.totals["pool/failed_requests"] += 1
                    if self.totals["pool/failed_requests"] > c.max_failed_requests:
                        raise RunError(f"more than {c.max_failed_requests} rollout requests failed") from e
                    continue
                for version, b in self.schedule.results(req, res):  # lockstep: the whole step, in chunk order
                    buf.add(version, b, samples=len(b))  # a group is as old as its oldest token
                    trace.mixed_samples(key, pool, b)
                texts.add(res.completions)
                step_stats["timing_s/generate"] += res.generate_s
                continue
            # a trainer rank finished: wait for the others, then close the step
            metrics = self._finish_train(train_refs)
            train_refs = None
            if metrics is None:  # a trainer rank was lost; the group re-formed at the latest committed version
                if self.trainers.version == step:  # the step never committed: train the same batch again
                    train_refs = self._start_train(step)
                    continue
                if self.trainers.version != step + 1:
                    raise RunError(f"trainer group re-formed at v{self.trainers.version}, driver at step {step}")
                metrics = {"version": step + 1}  # committed before the loss was seen: the step counts
            step += 1
            self.channels.after_publish()
            step_stats["timing_s/train"] = time.monotonic() - train_started
            end = now_ns()
            m = self._close_step(step, agg, trace, metrics, step_stats, step_start_ns, end)
            m.update(self.evals.run(self, step))
            self.pools.on_step(step, m)
            self.trainers.after_step(step)
            logger.log(m, step=step)
            logger.log_rows("completions", texts.take(trained_prompts(self._batch)), step=step)
            bar.update(step, version=int(m["version"]), reward=m.get("reward/mean"), stall_s=m["stall/total_s"],
                       staleness=m.get("staleness/mean"), sync_stall_s=m.get("stall/rollout_wait_weights_s"),
                       sync_bytes=m.get("sync/bytes"))
            step_start_ns, step_stats = end, defaultdict(float)
            if c.checkpoint.enabled and (step == c.steps or (c.checkpoint.every and step % c.checkpoint.every == 0)):
                self._checkpoint(ckpt, step)
            trace.flush()
        if self._stop_requested.is_set() and c.checkpoint.enabled and step > ckpt.latest_step():  # Ctrl-C: no step lost
            self._checkpoint(ckpt, step)

    def _start_train(self, step: int) -> list:
        try:
            return self.trainers.start_train(self._batch, step, audit=self.audit.see)
        except TrainerGroupError as e:
            raise RunError(str(e)) from e

    def _finish_train(self, refs: list) -> dict[str, float] | None:
        """Mean metrics over ranks; None: a rank was lost and the (elastic) group re-formed."""
        try:
            return self.trainers.finish_train(refs)
        except TrainerGroupError as e:
            raise RunError(str(e)) from e

    def _close_step(self, step: int, agg: StepAggregator, trace: TraceWriter, tm: dict[str, float],
                    stats: dict[str, float], start_ns: int, end_ns: int) -> dict[str, float]:
        refs = {**self.trainers.drain_refs(), **self.pools.drain_refs()}
        records = []
        for k, ref in refs.items():
            try:
                records.extend(ray.get(ref, timeout=min(30.0, self.cfg.timeout_s)))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                log.warning("no stall records from %s: %s", k, e)
        agg.add(records)
        trace.add(records)
        sm = agg.close_step(end_ns, hub=self._hub_stats())
        self.totals["staleness/dropped_total"] += stats.get("staleness/dropped", 0.0)
        self.totals["steps"] = step
        payload = int(self.audit.bytes - self.totals["ray/payload_bytes"])
        self.totals["ray/payload_bytes"] = self.audit.bytes
        self.totals["ray/weight_like_tensors"] = self.audit.weight_like
        self.totals["sync/bytes"] += sm.sync.bytes
        out: dict[str, float] = {
            "step": step, "version": int(tm["version"]),
            "loss/policy": tm.get("policy_loss", float("nan")),
            "kl": tm.get("kl", tm.get("approx_kl", float("nan"))),
            "kl/behaviour": tm.get("approx_kl", float("nan")),
            "entropy": tm.get("entropy", float("nan")),
            "clip_frac": tm.get("clip_frac", float("nan")),
            "grad_norm": tm.get("grad_norm", float("nan")),
            "zero_spread_group_frac": tm.get("zero_spread_group_frac", float("nan")),
            "staleness/dropped": stats.get("staleness/dropped", 0.0),
            "staleness/dropped_total": self.totals["staleness/dropped_total"], "verify/quarantined_samples": self.schedule.quarantined_samples,
            "timing_s/step": (end_ns - start_ns) / 1e9,
            "data/cursor": self.task.cursor,
            "ray/payload_bytes": payload,
            "ray/weight_like_tensors": self.audit.weight_like,
        }
        if "kl" in tm:
            out["kl/ref"] = tm["kl"]
        for k in ("value_loss", "critic_grad_norm", "ratio_mean", "sync/trainer_gathered_bytes"):
            if k in tm:
                out[f"loss/{k}" if k == "value_loss" else k] = tm[k]
        out.update({k: v for k, v in tm.items() if k.startswith(("offpolicy/", "mismatch/"))})  # docs/derived.md
        if "logprob_gap" in tm:  # rollout engine's log-probs vs the trainer's, same weights (docs/vllm.md)
            out["rollout/logprob_gap"] = tm["logprob_gap"]
        out.update({k: v for k, v in stats.items() if k not in out})
        out.update(self.trainers.step_metrics())
        out.update(sm.to_dict())
        out.update(self.pools.ledger.window(records, start_ns, end_ns))
        out.update(self.pools.step_metrics())
        for k, v in out.items():
            if k.startswith("events/"):
                self.totals[k] += v
        self.totals.update(self.pools.ledger.totals())
        trace.step(step, start_ns, end_ns, version=out["version"], reward=out.get("reward/mean"))
        self.totals["reward/last"] = out.get("reward/mean", float("nan"))
        return out

    def _checkpoint(self, ckpt: CheckpointStore, step: int) -> None:
        path = ckpt.begin(step)
        self._trainer_call("save_checkpoint", [str(path)] * self.trainers.world_size)
        # The cursor is past every prompt handed out, trained or still in flight (see checkpoint.py).
        ckpt.commit(step, {"step": step, "version": step, "task": self.task.state_dict(),
                           "totals": dict(self.totals)})

