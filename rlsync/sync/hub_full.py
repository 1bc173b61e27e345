"""`sync.mode=hub`, whole versions: trainer rank 0 registers its live tensors as version v (no copy); each
engine fetches `latest` from the best replica (the trainer or a peer engine) when its request needs it.

    publisher: rank 0 `hub.publish(model, v, live)`; `release()` before the next step writes them
    receiver:  ensure(min_version): one parked `hub.wait_latest(model, min_version)` (no polling), then
               `hub.fetch(model, "latest", into=engine.named_parameters_for_sync())`; an engine that reads
               the hub itself (vLLM: staged, or TP-sliced) gets the hub client and `update_latest()`

`HubReceiver` is also the base of the delta and sharded readers (hub_delta.py, hub_sharded.py): they
change only how one read of `latest` goes (`_read`).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from rlsync.core.digest import weights_digest
from rlsync.core.events import FetchEvent
from rlsync.hub import Shard
from rlsync.hub import errors as E

from .base import Side, WeightPublisher, WeightReceiver, WeightSync, register_weight_sync
from .engine import need
from .inflight import InflightFollower
from .verify import ConvertedDigests, EngineVerifier, WeightsVerifyError, expected_digests, publish_probe

log = logging.getLogger(__name__)


class HubFullPublisher(WeightPublisher):
    def publish(self, backend: Any) -> dict:
        v, tensors, n = self._whole(backend)
        out = {"version": v, "bytes": n}
        if self.rank == 0:
            self._publish(v, {k: x.contiguous() for k, x in tensors.items()})
            self.published = v
            check = self.side.sync.verify
            if check.probe_every and v % check.probe_every == 0 and self.side.shape.zero_stage < 3:
                publish_probe(self.hub, self.model, v, backend.policy, check.probe_tokens)  # docs/verify.md
            self.clock.event("publish", version=v, bytes=n)
            if self.digest:  # what a recovery must reproduce bit for bit (docs/elastic.md)
                out["digest"] = weights_digest(tensors)
        return out

    def _publish(self, version: int, live: dict) -> None:
        self.hub.publish(self.model, version, live)


class HubReceiver(WeightReceiver):
    """An engine fed from the hub: whole versions into its parameters, or through its own staging."""

    layout = None
    """The trainer's `ShardedLayout` when it publishes ZeRO-3 partitions (hub_sharded.py), else None."""

    def __init__(self, side: Side, engine: Any, *, params: Any = None, delay_s: float = 0.0):
        super().__init__(side, engine, params=params, delay_s=delay_s)
        need(self.caps, type(self).__name__, "in_place_fetch", "staged", "tp_sliced")
        if self.sync.inflight:
            need(self.caps, f"{type(self).__name__} with sync.inflight=true", "inflight")
        if self.caps.reads_hub:  # the hub cannot fetch into vLLM's repacked parameters (docs/vllm.md)
            self._attach()
        self.verifier = EngineVerifier(self.sync.verify, self.hub, self.model, engine, self.clock) \
            if self.caps.verify else None  # what the engine computes with, after every apply (verify.py)
        self.follower: InflightFollower | None = None
        if self.sync.inflight:  # stage each version as it commits; the engine switches between decode steps
            engine.start_inflight(self.sync.kv_policy)
            self.follower = InflightFollower(self.hub, self.model, engine, self.caps, self.clock, self.sync.wait_s,
                                             nice=self.sync.stage_nice, escalate_s=self.sync.stage_escalate_s)
            self.follower.start()
        elif self.verifier is not None and self.caps.staged and self.sync.verify.overlap and self.sync.verify.weights:
            dtype = self._held_dtype()  # each version's expected digests made as it lands, off the pause
            engine.verify_ahead(lambda m, staged, recheck: expected_digests(m, staged, dtype, recheck))

    def _attach(self) -> None:
        self.engine.attach_hub(self.hub, self.model, layout=self.layout)

    def _held_dtype(self):
        """The dtype the engine holds each tensor in after the apply (None: the manifest's own)."""
        return self.engine.compute_dtype

    def ensure(self, min_version: int, eager: bool = False) -> None:
        if self.follower is not None:
            return self._ensure_inflight(min_version)
        if self.verifier is not None:  # an overlapped check reads the buffers the apply below overwrites
            self.verifier.settle()
        if self.caps.staged:
            with self.clock.state("loading_weights"):
                staged = self.engine.apply_staged()  # a prefetched newer version: the only pause
            if staged is not None:
                self._record(staged)
        if self.engine.version >= min_version:
            if not eager:
                return
            latest = self.hub.latest(self.model)
            if latest is None or latest <= self.engine.version:
                return
        else:
            self._wait_for(min_version)
        self._record(self._fetch_latest())

    def _ensure_inflight(self, min_version: int) -> None:
        """In-flight: record the switches made inside `generate`, take a staged newer version now (between
        calls), and when the engine still lacks `min_version`, wait until the follower has staged it."""
        for got in self.engine.take_switches():
            self._record_switch(got, used=True)
        self._switch()
        if self.engine.version >= min_version:
            return
        self._wait_for(min_version)
        with self.clock.state("waiting_weights"):
            while not self.follower.wait_staged(min_version, self.sync.wait_s):
                log.info("still waiting for %s v%d to be staged", self.model, min_version)
        self._switch()
        if self.engine.version < min_version:  # cannot happen unless the engine refused its own build
            raise RuntimeError(f"{self.model} v{min_version} staged but the engine holds v{self.engine.version}")

    def _switch(self) -> None:
        with self.clock.state("loading_weights"):  # the swap (or, with no double buffer, the drained apply)
            got = self.engine.apply_staged() if self.caps.staged else self.engine.switch_prepared()
        if got is not None:
            self._record_switch(got)

    def _record_switch(self, got, used: bool = False) -> None:
        """An in-flight switch (a `SyncStats`): the pause is the swap; never moves the engine's version.
        `used`: made inside a `generate` (its samples exist: a failed check marks them)."""
        raised = {v for v in self.follower.raised if v <= got.version}
        self.follower.raised -= raised  # `sync/stage_raised`: versions whose idle staging had to be raised
        self.clock.event("engine_update", version=got.version, fetch_s=got.fetch_s, apply_s=got.apply_s,
                         pause_s=got.pause_s, fetch_wait_s=got.fetch_wait_s, in_flight=got.in_flight,
                         decode_pause_s=got.pause_s,  # `sync/decode_pause_s`: what generation stopped for
                         stage_raised=float(got.version in raised))
        if got.bytes_by_source:
            self.follower.last_sources = dict(got.bytes_by_source)
            ev = FetchEvent.from_result(got, wid=self.hub.worker_id, dc=self.hub.location.dc)
            self.clock.event(FetchEvent.NAME, **ev.attrs())
        self._verify(got.version, None if self.caps.reads_hub else self.follower.manifest, in_flight=used)

    def verify_generated(self) -> set[int]:
        if self.verifier is None:
            return set()
        with self.clock.state("loading_weights"):
            self.verifier.settle()  # an overlapped weights check of the version this batch used
        if self.follower is not None:  # switches made inside `generate`: checked now, before its samples go out
            for got in self.engine.take_switches():
                self._record_switch(got, used=True)
        failed, self.verifier.failed = self.verifier.failed, set()
        return failed

    def _wait_for(self, min_version: int) -> None:
        """Until `min_version` commits: one `wait_latest` parked at the hub (asked again each `sync.wait_s`)."""
        with self.clock.state("waiting_weights"):
            if self.delay_s:
                time.sleep(self.delay_s)
            while (latest := self.hub.wait_latest(self.model, min_version, self.sync.wait_s)) is None \
                    or latest < min_version:
                log.info("still waiting for %s v%d (latest %s)", self.model, min_version, latest)

    def prefetch(self) -> None:
        if self.caps.staged:
            self.engine.prefetch_latest()  # fetch what is newer while this batch generates

    def join(self) -> dict[str, int]:
        """Fetch `latest` now (the planner prefers peers near this worker over the trainer); before the
        first publish, nothing."""
        try:
            latest = self.hub.latest(self.model)
        except E.UnknownModelError:  # nothing published yet (the run is starting)
            latest = None
        if latest is None:
            return {}
        if self.follower is not None:  # the follower fetches it (a second fetch here would race it)
            self._ensure_inflight(latest)
            return dict(self.follower.last_sources)
        got = self._fetch_latest()
        self._record(got, join=True)
        return dict(got.bytes_by_source)

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()
        if self.caps.reads_hub:
            self.engine.close()  # stop prefetching first

    def _fetch_latest(self, attempts: int = 8):
        """Read `latest` into the engine; retry when the version resolved is lost meanwhile.

        Race: `latest` resolves to v, then v + 1 commits and every holder of v lets it go (the
        trainer steps, peers fetch v + 1 into the same buffers) before this read is served. v is
        then no longer retained and the hub says so (VersionLostError); `latest` is now v + 1.
        A retry overwrites every buffer, so a half-written v never survives.
        """
        for attempt in range(attempts):
            try:
                with self.clock.state("loading_weights"):
                    return self._read()
            except (E.VersionLostError, E.VersionNotRetainedError, E.TransferError) as e:
                self.engine.version = -1  # the buffers may hold a mix now
                self.clock.event("fetch_retry", error=type(e).__name__)
                log.info("fetch of latest %s failed (%s); retrying (%d/%d)", self.model, e, attempt + 1, attempts)
                with self.clock.state("waiting_weights"):
                    time.sleep(min(2.0, 0.05 * 2 ** attempt))
        raise RuntimeError(f"could not fetch {self.model!r} latest in {attempts} attempts")

    def _read(self):
        """One read of `latest` into the engine: a hub `FetchResult`, or the engine's `SyncStats`."""
        if self.caps.reads_hub:
            return self.engine.update_latest()
        self._release_held()
        return self.hub.fetch(self.model, "latest", into=self.engine.named_parameters_for_sync())

    def _shard_of(self, key: str) -> Shard:
        return Shard()

    def _release_held(self) -> None:
        """Release the version our buffers hold before asking for the next one (a hub race, docs/rl.md).

        The hub advertises this worker as a relay of the new version the moment it plans the fetch,
        but our data server holds that relay only after the plan is back and the old version in the
        same buffers is released (which waits for its readers to drain). A reader planned on us in
        between is refused, marks us suspect and re-plans, across the DC link when we are its only
        in-DC source. Releasing first shrinks that window to one RPC reply.
        """
        for rid in self.hub.held_ids():
            if rid.model == self.model and rid.slot == "live":
                self.hub.release(self.model, rid.version, self._shard_of(rid.shard))

    def _record(self, got, **extra) -> None:
        self.engine.version = got.version
        if self.caps.reads_hub:  # a SyncStats: the engine's fetch, apply and pause (sync/fetch_s, apply_s, pause_s)
            self.clock.event("engine_update", version=got.version, fetch_s=got.fetch_s, apply_s=got.apply_s,
                             pause_s=got.pause_s, fetch_wait_s=got.fetch_wait_s)
        if not self.caps.reads_hub or got.bytes_by_source:  # else: applied a version already fetched and recorded
            ev = FetchEvent.from_result(got, wid=self.hub.worker_id, dc=self.hub.location.dc, **extra)
            self.clock.event(FetchEvent.NAME, **ev.attrs())
        if getattr(got, "nbytes", 1) or getattr(got, "apply_s", 0.0):  # else nothing new to check
            self._verify(got.version, getattr(got, "manifest", None))

    def _verify(self, version: int, manifest=None, in_flight: bool = False) -> None:
        """Check what the engine now computes with; on a failure quarantine it and re-apply (verify.py).
        `in_flight`: switched in inside `generate` (its samples exist already). Overlapped (the weights check
        runs while the engine generates; `verify_generated` waits for it) only for an engine the hub fetches
        into and that does not switch in flight, and for a staged engine whose expected digests were made as
        the version landed (`verify_ahead`): else buffers the check reads (the engine's spare, a vLLM stage's
        staging, which its prefetch refills) may change under it."""
        if self.verifier is None:
            return
        with self.clock.state("loading_weights"):
            if self.caps.reads_hub:  # the engine converts from its own staging: it says what it applied from
                first = None
                with self.engine.staging_held():
                    manifest, staged = self.engine.verify_source()
                    ahead = isinstance(staged, ConvertedDigests) and self.sync.verify.overlap and not in_flight
                    if not ahead:
                        try:
                            self.verifier.check(version, manifest, staged)
                            return
                        except WeightsVerifyError as e:
                            first = e
                if ahead:  # digests made as the version landed: no staging to hold, so it runs while generating
                    self.verifier.start(version, manifest, self._reapply, staged)
                else:
                    self.verifier.heal(version, manifest, self._reapply, staged, used=in_flight, first=first)
            elif self.sync.verify.overlap and self.follower is None:
                self.verifier.start(version, manifest, self._reapply)
            else:
                self.verifier.heal(version, manifest, self._reapply, used=in_flight)

    def _reapply(self, version: int):
        """Take `version` again, never from this worker's own copy (it may be the corrupt one)."""
        if self.caps.reads_hub:
            self.engine.reapply(version)
            return self.engine.verify_source()
        self._release_held()
        if self.follower is not None:  # in flight: into the spare buffers, then switched in
            got = self.hub.fetch(self.model, version, into=self.engine.next_buffers())
            self.engine.offer_next(version)
            self.engine.switch_prepared()
            return got.manifest, None
        got = self.hub.fetch(self.model, version, into=self.engine.named_parameters_for_sync())
        return got.manifest, None


@register_weight_sync("hub_full")
class HubFull(WeightSync):
    """Whole versions through the hub: the default route."""

    mode, order = "hub", 2
    publisher, receiver = HubFullPublisher, HubReceiver

    @classmethod
    def misfit(cls, sync, shape) -> str | None:
        if sync.variant != "none":
            return "reads no variants (sync.variant: hub_derived)"
        return "publishes no deltas (sync.deltas=true: hub_delta)" if sync.deltas else None
