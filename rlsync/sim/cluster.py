"""Simulated workers around the REAL hub: `HubState` decides, the engine moves the bytes.

    c = SimCluster(net, HubConfig(planner=PlannerConfig(fanout_cap=1)), unit_bytes=512 << 10)
    c.join("trainer"); c.join("ro0")
    c.publish("trainer", "policy", 1, nbytes=64 << 20)
    c.fetch("ro0", "policy", on_done=lambda t: print("ro0 holds v1 at", t))
    c.engine.run()

Nothing here decides where bytes come from or when a copy may go: every join, publish, fetch,
re-plan, fetch-done, release and expiry is a call on one in-process `rlsync.hub.state.HubState`
whose clock is the simulated clock, and each plan it returns is executed as one flow per source
(`Engine`), with relay sources coupled to their upstream's progress. So a change to the planner or
to retention changes the simulated times, and nothing is copied from them.

What is modelled of the control plane: every RPC costs `rpc_s` (round trip) and the hub serves one
request at a time (a FIFO queue), each taking `hub_service_s` of hub time, or, with
`hub_service_s=None`, the CPU time the real `HubState` call took in this thread (the planner's own
cost at this scale, as on a hub with a core to itself; CPU time, so the machine's load barely moves it). Heartbeats are not simulated as messages: a live worker counts as heard
from whenever the hub runs an expiry, as it would be with heartbeats well inside the timeout.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from rlsync.hub import errors as E
from rlsync.hub.model.manifest import Manifest, TensorSpec, Unit
from rlsync.hub.model.shard import Shard
from rlsync.hub.state import DONE, PENDING, SEED, HubConfig, HubState, Plan

from .engine import Engine, Flow, Transfer
from .network import Network

log = logging.getLogger(__name__)


def synthetic_manifest(nbytes: int, unit_bytes: int) -> Manifest:
    """A manifest of one uint8 tensor of `nbytes` cut into units of `unit_bytes` (no bytes behind it)."""
    if nbytes <= 0 or unit_bytes <= 0:
        raise ValueError("nbytes and unit_bytes must be > 0")
    units = tuple(Unit(((0, off, min(unit_bytes, nbytes - off)),), min(unit_bytes, nbytes - off), 0)
                  for off in range(0, nbytes, unit_bytes))
    return Manifest((TensorSpec("w", "uint8", (nbytes,), nbytes),), units, nbytes)


@dataclass(eq=False, slots=True)
class FetchRun:
    node: str
    model: str
    shard: Shard
    fetch_id: str
    version: int
    manifest: Manifest
    transfer: Transfer
    on_done: Callable[[float], None] | None
    started: float
    pending: dict = field(default_factory=dict)
    """Flow -> (replica id, unit ids) still moving."""
    sources: dict = field(default_factory=dict)
    """Source node -> bytes it served (for reports: e.g. how many crossed a DC)."""


class SimCluster:
    def __init__(self, net: Network, hub_cfg: HubConfig, *, unit_bytes: int, rpc_s: float = 0.0,
                 hub_service_s: float | None = 0.0, offload_bps: float = 25e9) -> None:
        self.net = net
        self.engine = Engine(net)
        self.hub = HubState(hub_cfg, clock=lambda: self.engine.now)
        self.unit_bytes = int(unit_bytes)
        self.rpc_s = rpc_s
        self.hub_service_s = hub_service_s
        self.offload_bps = offload_bps
        """Device-to-host copy rate of an offload seed (bytes/s)."""
        self.wid: dict[str, str] = {}
        self.node_of: dict[str, str] = {}
        self.dead: set[str] = set()
        self.manifests: dict[tuple, Manifest] = {}
        self.runs: dict[tuple, FetchRun] = {}     # (node, model, version, shard key) -> open fetch
        self.waiting_releases: dict[str, tuple[str, Callable]] = {}
        self.hub_busy_s = 0.0
        self.rpcs = 0
        self._hub_q: deque = deque()
        self._hub_idle = True
        self.errors: list[str] = []

    # ---------------------------------------------------------------- the hub as a single-threaded server
    def call(self, fn: Callable, *args, reply: Callable | None = None, error: Callable | None = None) -> None:
        """Send one request to the hub: it runs `fn(*args)` after half a round trip and its queue; the
        result (or the HubError raised) is delivered to `reply` (or `error`) half a round trip later."""
        self.rpcs += 1
        self.engine.at(self.rpc_s / 2, self._arrive, fn, args, reply, error)

    def _arrive(self, fn, args, reply, error) -> None:
        self._hub_q.append((fn, args, reply, error))
        if self._hub_idle:
            self._serve()

    def _serve(self) -> None:
        if not self._hub_q:
            self._hub_idle = True
            return
        self._hub_idle = False
        fn, args, reply, error = self._hub_q.popleft()
        t0 = time.thread_time()
        try:
            out, failed = fn(*args), None
        except E.HubError as e:
            out, failed = None, e
        took = time.thread_time() - t0 if self.hub_service_s is None else self.hub_service_s
        self.hub_busy_s += took
        if failed is None and reply is not None:
            self.engine.at(took + self.rpc_s / 2, reply, out)
        elif failed is not None:
            if error is None:
                self.errors.append(f"{type(failed).__name__}: {failed}")
                log.warning("sim: unhandled hub error: %s", failed)
            else:
                self.engine.at(took + self.rpc_s / 2, error, failed)
        self.engine.at(took, self._serve)

    # ---------------------------------------------------------------- membership
    def join(self, node: str, role: str = "worker") -> str:
        """Join now (no RPC delay: set-up, before any timed activity); returns the worker id."""
        n = self.net.nodes[node]
        wid = self.hub.join(node, n.location, {"node": node}, role=role)
        self.wid[node], self.node_of[wid] = wid, node
        self.dead.discard(node)
        return wid

    def join_rpc(self, node: str, then: Callable[[str], None]) -> None:
        """Join through an RPC (a worker arriving mid-run)."""
        n = self.net.nodes[node]

        def done(wid: str) -> None:
            self.wid[node], self.node_of[wid] = wid, node
            self.dead.discard(node)
            then(wid)
        self.call(self.hub.join, node, n.location, {"node": node}, reply=done)

    def heard_from_all(self) -> None:
        """Live workers' heartbeats, as the hub would have seen them by now."""
        for node, wid in self.wid.items():
            if node not in self.dead and wid in self.hub.workers:
                self.hub.touch(wid)

    # ---------------------------------------------------------------- publish
    def manifest(self, model: str, version: int, shard: Shard, nbytes: int) -> Manifest:
        key = (model, version, shard.key)
        if key not in self.manifests:
            self.manifests[key] = synthetic_manifest(int(nbytes), self.unit_bytes)
        return self.manifests[key]

    def publish(self, node: str, model: str, version: int, nbytes: int, shard: Shard = Shard(),
                then: Callable[[bool], None] | None = None, rpc: bool = True) -> None:
        """Register `node`'s live weights as (model, version, shard): no copy, one RPC."""
        m = self.manifest(model, version, shard, nbytes)
        if rpc:
            self.call(self.hub.publish, self.wid[node], model, version, shard, m, reply=then)
        else:
            out = self.hub.publish(self.wid[node], model, version, shard, m)
            if then:
                then(out)

    # ---------------------------------------------------------------- fetch
    def fetch(self, node: str, model: str, version: int | str = "latest", shard: Shard = Shard(),
              on_done: Callable[[float], None] | None = None, group: tuple[str, int] | None = None,
              on_error: Callable[[Exception], None] | None = None) -> None:
        """`node` fetches (model, version, shard): plan RPC, one flow per planned source, fetch_done."""
        t0 = self.engine.now
        self.call(self.hub.plan_fetch, self.wid[node], model, version, shard, group,
                  reply=lambda plan: self._execute(node, model, shard, plan, on_done, t0), error=on_error)

    def _execute(self, node: str, model: str, shard: Shard, plan: Plan, on_done, t0: float) -> None:
        if node in self.dead:
            return
        if plan.held:
            if on_done:
                on_done(self.engine.now)
            return
        run = FetchRun(node, model, shard, plan.fetch_id, plan.version, plan.manifest,
                       Transfer(float(plan.manifest.nbytes)), on_done, t0)
        self.runs[(node, model, plan.version, shard.key)] = run
        self._start_flows(run, plan)

    def _start_flows(self, run: FetchRun, plan: Plan) -> None:
        for rep, worker, units in plan.sources:
            if not units:
                continue
            src = self.node_of[worker.id]
            nbytes = sum(run.manifest.units[u].nbytes for u in units)
            up = None
            if not rep.full:
                up_run = self.runs.get((src, rep.model, rep.version, rep.shard))
                up = up_run.transfer if up_run is not None else None
            lag = max(run.manifest.units[u].nbytes for u in units)
            f = Flow(self.net.path(src, run.node), float(nbytes), on_done=lambda fl, r=run: self._flow_done(r, fl),
                     owner=run.transfer, upstream=up, lag=float(lag))
            run.pending[f] = (rep.id, list(units), src)
            self.engine.start(f)
        if not run.pending:
            self._finish(run)

    def _flow_done(self, run: FetchRun, f: Flow) -> None:
        rid, units, src = run.pending.pop(f)
        run.sources[src] = run.sources.get(src, 0) + f.nbytes
        if not run.pending:
            self._finish(run)

    def _finish(self, run: FetchRun) -> None:
        run.transfer.done = True
        run.transfer.got = run.transfer.total
        self.engine._dirty = True  # downstream relays lose their cap
        self.runs.pop((run.node, run.model, run.version, run.shard.key), None)
        t_done = self.engine.now
        self.call(self.hub.fetch_done, self.wid[run.node], run.fetch_id, True, reply=lambda _: self._after_change())
        if run.on_done:
            run.on_done(t_done)

    # ---------------------------------------------------------------- release
    def release(self, node: str, model: str, version: int, shard: Shard = Shard(), slot: str = "live",
                then: Callable[[float], None] | None = None) -> None:
        """Release `node`'s replica; `then(t)` when the hub says it may go (after waits and seeding)."""
        wid = self.wid[node]

        def answered(outcome) -> None:
            if outcome is DONE or outcome == str(DONE):
                if then:
                    then(self.engine.now)
            elif outcome is PENDING:
                rid = f"{wid}:{model}:{version}:{shard.key}:{slot}"
                self.waiting_releases[rid] = (node, then, model, version, shard, slot)
            elif outcome is SEED:
                self._offload_then_release(node, model, version, shard, then)
        self.call(self.hub.release, wid, model, version, shard, slot, reply=answered)

    def _offload_then_release(self, node, model, version, shard, then) -> None:
        m = self.manifests[(model, version, shard.key)]
        wid = self.wid[node]

        def copied() -> None:
            self.call(self.hub.register_replica, wid, model, version, shard, "seed", m,
                      reply=lambda _: self.release(node, model, version, shard, "live", then))
        self.engine.at(m.nbytes / self.offload_bps, copied)

    def _after_change(self) -> None:
        """What the server does after each request: re-check pending releases, answer finished ones."""
        out = self.hub.poll_releases()
        for rid in list(self.waiting_releases):
            if rid in out or rid not in self.hub.pending_releases:
                node, then, model, version, shard, slot = self.waiting_releases.pop(rid)
                if out.get(rid) is SEED:
                    self._offload_then_release(node, model, version, shard, then)
                elif then:
                    self.engine.at(self.rpc_s / 2, then, self.engine.now + self.rpc_s / 2)

    # ---------------------------------------------------------------- churn
    def preempt(self, node: str) -> None:
        """`node` dies without notice: its flows stop now; readers re-plan around it at once (they see
        the connection drop); the hub forgets it only when it expires (`worker_timeout_s`)."""
        self.dead.add(node)
        wid = self.wid[node]
        for key in [k for k, r in self.runs.items() if r.node == node]:
            run = self.runs.pop(key)
            for f in list(run.pending):
                self.engine.cancel(f)
        for run in list(self.runs.values()):
            lost = [(f, v) for f, v in run.pending.items() if v[2] == node]
            if not lost:
                continue
            failed, missing = [], []
            for f, (rid, units, _src) in lost:
                got = self.engine.cancel(f)
                del run.pending[f]
                done_units, acc = 0, 0.0
                for u in units:  # units arrive in order: the complete ones are kept
                    acc += run.manifest.units[u].nbytes
                    if acc > got + 1e-6:
                        break
                    done_units += 1
                failed.append(rid)
                missing += units[done_units:]
            self.call(self.hub.replan, self.wid[run.node], run.fetch_id, failed, sorted(missing),
                      reply=lambda plan, r=run: self._start_flows(r, plan),
                      error=lambda e, r=run: self._fetch_failed(r, e))
        self.engine.at(self.hub.cfg.worker_timeout_s, self._expire_now)
        log.debug("preempted %s (%s)", node, wid)

    def leave(self, node: str, then: Callable[[float], None] | None = None) -> None:
        """`node` leaves cleanly (its replicas are not needed elsewhere): one RPC."""
        self.dead.add(node)
        self.call(self.hub.remove_worker, self.wid[node],
                  reply=lambda _: (self._after_change(), then and then(self.engine.now)))

    def _fetch_failed(self, run: FetchRun, e: Exception) -> None:
        self.errors.append(f"{run.node} fetch {run.fetch_id}: {type(e).__name__}: {e}")
        for f in list(run.pending):
            self.engine.cancel(f)
        self.runs.pop((run.node, run.model, run.version, run.shard.key), None)

    def _expire_now(self) -> None:
        self.heard_from_all()
        self.hub.expire()
        self._after_change()


def bytes_per_s(rate: str | float) -> float:
    """'250mbit' / '200gbit' / bits-per-second number -> bytes/s."""
    if isinstance(rate, (int, float)):
        return float(rate) / 8
    text = rate.strip().lower()
    for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale / 8
    raise ValueError(f"bad rate {rate!r}: use e.g. 250mbit, 200gbit")

