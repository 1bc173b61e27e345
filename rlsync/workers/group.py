"""`WorkerGroup`: worker actors of one class with a common lifecycle (start, add, remove, kill).

Plain worker classes (testable without Ray; their set-up and hub client: process.py) get a `drain_stall`
method from `with_telemetry`; `WorkerGroup` turns them into Ray actors with a `telemetry` concurrency
group, so the driver can cut a step window while the worker is busy. Each actor is built from the
keyword arguments `make_kwargs(i)` returns (its own sections, never the whole run config). Weights
never travel in a call's arguments or results.

    group = WorkerGroup("seed-dc1", SeedWorker, lambda i: dict(dc="dc1", hub=hub, setup=setup), num_cpus=0.25)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import ray

from rlsync.workers.process import WORKER_ENV

log = logging.getLogger(__name__)


class WorkerGroup:
    """A named set of Ray actors of one worker class with a common lifecycle: start, add, remove, kill.

        group = WorkerGroup("main", RolloutWorker, lambda i: dict(pool="main", index=i, **sections), num_cpus=0.5)
        group.start(2); group.members            # {"main-0": handle, "main-1": handle}
        group.remove("main-1")                   # graceful: leaves the hub, then the actor ends
        group.kill("main-0")                     # no notice (what a spot preemption looks like)

    Actor creation is asynchronous: `start`/`add` return at once; `wait_ready` blocks with a timeout.
    """

    def __init__(self, name: str, worker_cls: type, make_kwargs: Callable[[int], dict[str, Any]], *,
                 num_cpus: float = 0.5, env: dict[str, str] | None = None, first_index: int = 0,
                 resources: dict[str, float] | None = None):
        """`resources`: Ray custom resources each actor asks for (e.g. {"pool_node": 1}: only on nodes that have it)."""
        self.name, self.make_kwargs = name, make_kwargs
        self._actor = ray.remote(concurrency_groups={"telemetry": 1})(worker_cls)
        self._opts = dict(num_cpus=num_cpus, max_restarts=0, max_concurrency=1,
                          runtime_env={"env_vars": {**WORKER_ENV, **(env or {})}})
        if resources:
            self._opts["resources"] = dict(resources)
        self.members: dict[str, Any] = {}
        self._next = first_index

    def add(self, *, namespace: str | None = None, detached: bool = False) -> str:
        """Start one more actor; with `namespace` it is named `<key>` there (and `detached` outlives its creator)."""
        i = self._next
        self._next += 1
        key = f"{self.name}-{i}"
        named = dict(name=key, namespace=namespace) if namespace else dict(name=None)
        if detached:
            named["lifetime"] = "detached"
        self.members[key] = self._actor.options(**named, **self._opts).remote(**self.make_kwargs(i))
        return key

    def adopt(self, key: str, handle: Any) -> None:
        """Take over an actor someone else started (a pool attached by `python -m rlsync.pools join`)."""
        self.members[key] = handle
        self._next = max(self._next, int(key.rsplit("-", 1)[1]) + 1) if key.rsplit("-", 1)[-1].isdigit() else self._next

    def start(self, n: int) -> list[str]:
        return [self.add() for _ in range(n)]

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        keys = list(self.members)
        return dict(zip(keys, ray.get([self.members[k].ready.remote() for k in keys], timeout=timeout_s)))

    def peak_rss_refs(self) -> dict[str, Any]:
        return {k: h.peak_rss_mb.options(concurrency_group="telemetry").remote() for k, h in self.members.items()}

    def drain_refs(self) -> dict[str, Any]:
        return {k: h.drain_stall.options(concurrency_group="telemetry").remote() for k, h in self.members.items()}

    def remove(self, key: str, timeout_s: float = 10.0) -> None:
        """Graceful: the worker leaves the hub (runs retention), then the actor is ended."""
        h = self.members.pop(key)
        try:
            ray.get(h.shutdown.remote(), timeout=timeout_s)
        except Exception as e:  # noqa: BLE001 - a dead or stuck worker is killed anyway
            log.warning("worker %s did not shut down cleanly: %s", key, e)
        ray.kill(h, no_restart=True)

    def kill(self, key: str) -> None:
        """Without notice: the hub notices by heartbeat timeout."""
        ray.kill(self.members.pop(key), no_restart=True)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        for key in list(self.members):
            self.remove(key, timeout_s)


def write_peak_rss(groups: list[WorkerGroup], path) -> dict[str, float]:
    """Ask every live member of `groups` for its peak RSS (MiB), write {"peak_rss_mb": {...}} to `path`."""
    import json

    refs = {k: r for g in groups for k, r in g.peak_rss_refs().items()}
    out = {}
    for k, ref in refs.items():
        try:
            out[k] = round(ray.get(ref, timeout=30), 1)
        except Exception as e:  # noqa: BLE001 - a dead worker has no answer
            log.debug("peak rss of %s: %s", k, e)
    if out:
        with open(path, "w") as f:
            json.dump({"peak_rss_mb": out}, f, indent=1)
        log.info("peak RSS per worker (MiB): %s", out)
    return out
