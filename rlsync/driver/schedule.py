"""Who gets which prompts, when, and in what order their results reach the trainer: the loop's two schedules.

    schedule = LockstepSchedule(run_seed=0, prompts_per_step=32, per_request=16) if cfg.deterministic \
        else AsyncSchedule(bound, prompts_per_step=32, per_request=16, total_steps=200)
    for ref, req in schedule.hand_out(step, training, buf, inflight, busy, pools, task, channels): ...
    for version, group in schedule.results(req, res): buf.add(version, group)   # what the buffer gets
    lost = schedule.lost(req)          # prompts lost with a failed call (0: the call is made again)

`AsyncSchedule` (the default) hands any free worker the next prompts as far ahead as the staleness bound
allows and buffers results in arrival order: fast, but which worker samples which prompt, with which
weights version, and the order of a step's groups all depend on timing, so one seed does not repeat a run.

`LockstepSchedule` (`deterministic=true`) makes them functions of (seed, step): step s's prompts are
handed out only once version s is published and nothing trains (synchronous, on-policy); chunk j of the
step goes to slot j (worker j mod n of the configured pools' ready workers, in their order) with the
sampling seed `sampling_seed(seed, s, j)`; the step's groups enter the buffer together, in chunk order,
when the last chunk is back. A failed call is made again with the same prompts and seed, so a lost worker
does not change what is sampled. docs/rl.md, "Repeatable runs".
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Iterator

from rlsync.driver.staleness import SampleBuffer, StalenessBound, plan_request

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Request:
    """One rollout call in flight."""

    pool: str
    key: str
    prompts: list
    slot: int = -1
    """Lockstep: the chunk of its step (-1: the async schedule)."""


def sampling_seed(run_seed: int, step: int, slot: int) -> int:
    """The sampling seed of chunk `slot` of step `step`: a pure function of the run's seed (63 bits)."""
    digest = hashlib.blake2b(f"rlsync/{run_seed}/{step}/{slot}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def verified_groups(res: Any, schedule: Any) -> list:
    """The call's groups but those with a response token of a version that failed verification (the engine was
    quarantined: docs/verify.md); the samples dropped are counted on `schedule.quarantined_samples`."""
    bad = getattr(res, "unverified_versions", None)
    if not bad:
        return list(res.groups)
    import torch

    keep, bad = [], torch.tensor(sorted(bad))
    for g in res.groups:
        if torch.isin(g.versions_per_token()[g.response_mask.bool()], bad).any():
            schedule.quarantined_samples += len(g)
        else:
            keep.append(g)
    log.warning("dropped %d samples of %s: generated with weights that failed verification",
                sum(len(g) for g in res.groups) - sum(len(g) for g in keep), res.worker)
    return keep


class AsyncSchedule:
    """Any free worker, the next prompts, up to k versions ahead (`plan_request`); results in arrival order."""

    quarantined_samples = 0
    """Samples dropped as generated with weights that failed verification (`verify/quarantined_samples`)."""

    def __init__(self, bound: StalenessBound, *, prompts_per_step: int, per_request: int, total_steps: int,
                 samples: int = 0):
        self.bound, self.pps, self.ppr, self.total_steps = bound, prompts_per_step, per_request, total_steps
        self.samples = samples  # completions each call decodes as text (logging.completions_per_step)

    def hand_out(self, step: int, training: bool, buf: SampleBuffer, inflight: int, busy: set[str], pools: Any,
                 task: Any, channels: Any) -> Iterator[tuple[Any, Request]]:
        for pool, key, h in pools.free(busy):
            target = plan_request(steps_done=step, training=training, buffered=buf.fresh(step + training, self.bound),
                                  inflight=inflight, groups_per_step=self.pps, bound=self.bound,
                                  total_steps=self.total_steps)
            if target is None or not channels.may_start(self.bound.min_version(target), step):
                return
            prompts = task.next_prompts(self.ppr)
            inflight += len(prompts)
            yield (h.rollout.remote(prompts, self.bound.min_version(target), samples=self.samples),
                   Request(pool, key, prompts))

    def results(self, req: Request, res: Any) -> list[tuple[int, Any]]:
        """Each group with its oldest token's version (an engine may switch versions mid-sample)."""
        return [(int(g.versions.min()), g) for g in verified_groups(res, self)]

    def lost(self, req: Request) -> int:
        return len(req.prompts)


class LockstepSchedule:
    """`deterministic=true`: one step at a time, chunk j to slot j with a derived seed, results in chunk order."""

    quarantined_samples = 0
    """Samples dropped as generated with weights that failed verification (`verify/quarantined_samples`)."""

    def __init__(self, *, run_seed: int, prompts_per_step: int, per_request: int, total_steps: int, samples: int = 0):
        self.seed, self.pps, self.ppr, self.total_steps = run_seed, prompts_per_step, per_request, total_steps
        self.samples = samples  # completions each call decodes as text (logging.completions_per_step)
        self.step = -1
        self.chunks: list[list] = []    # the step's prompts, chunk by chunk
        self.todo: list[int] = []       # chunks not handed out (or handed out again after a failure)
        self.done: dict[int, Any] = {}  # chunk -> its RolloutResult
        self._warned: set[str] = set()

    def workers(self, pools: Any) -> list[tuple[str, str, Any]]:
        """(pool, key, handle) of the configured pools' ready workers, in a fixed order (attached pools get
        no prompts: what they would sample would depend on when they joined)."""
        from rlsync.pool.pool_set import Member

        out = []
        for name, p in pools.pools.items():
            if p.attached:
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning("pool %s attached: deterministic=true gives it no prompts", name)
                continue
            out += [(name, k, h) for k, h in p.group.members.items() if p.state.get(k) == Member.READY]
        return out

    def hand_out(self, step: int, training: bool, buf: SampleBuffer, inflight: int, busy: set[str], pools: Any,
                 task: Any, channels: Any) -> Iterator[tuple[Any, Request]]:
        if training or step >= self.total_steps or not channels.may_start(step, step):
            return
        if self.step != step:  # version `step` is published and nothing trains: the step's prompts, in chunks
            prompts = task.next_prompts(self.pps)
            self.step, self.done = step, {}
            self.chunks = [prompts[i:i + self.ppr] for i in range(0, len(prompts), self.ppr)]
            self.todo = list(range(len(self.chunks)))
        workers = self.workers(pools)
        for slot in list(self.todo):
            if not workers:
                return
            pool, key, h = workers[slot % len(workers)]
            if key in busy:  # its earlier chunk first: one call per worker at a time
                continue
            self.todo.remove(slot)
            busy.add(key)
            yield (h.rollout.remote(self.chunks[slot], step, sampling_seed(self.seed, step, slot), samples=self.samples),
                   Request(pool, key, self.chunks[slot], slot))

    def results(self, req: Request, res: Any) -> list[tuple[int, Any]]:
        """Nothing until the step's last chunk is back; then every group of the step, in chunk order."""
        if res.version != self.step:
            raise RuntimeError(f"deterministic: chunk {req.slot} of step {self.step} came from version {res.version}")
        self.done[req.slot] = res
        if len(self.done) < len(self.chunks):
            return []
        return [(int(g.versions.min()), g) for j in range(len(self.chunks)) for g in verified_groups(self.done[j], self)]

    def lost(self, req: Request) -> int:
        """A failed call: its chunk is handed out again (same prompts, same seed). No prompt is lost."""
        self.todo.append(req.slot)
        self.todo.sort()
        log.info("deterministic: chunk %d of step %d is handed out again", req.slot, self.step)
        return 0
