"""`HubWeightStage`: a vLLM engine's weights, fed in place by the hub through a host staging replica.

    stage = HubWeightStage(hub, engine, model="policy")   # hub: a joined rlsync.hub.HubClient
    stage.update("latest")       # join: fetch and apply now, pipelined tensor by tensor
    stage.prefetch(8)            # later: fetch v8 into staging while the engine keeps generating
    ...engine.generate(...)      # still v7
    stats = stage.apply_staged() # between batches: the only pause, the in-place apply of v8

Why a staging buffer: vLLM's CPU backend repacks its linear weights into kernel layouts, so the
hub cannot fetch into the engine's own parameters (they are size 0) and a peer cannot read the
weights back out of them. So each version lands in host buffers laid out like the version's
manifest (the trainer's names and dtypes), and the engine loads from there with its layerwise
reload. Those buffers are a full replica: with `serve_peers` (the default) the hub routes other
engines' fetches to them until the next version overwrites them, so an engine joining mid-run
reads from a peer engine, not from the trainer. The cost is one host copy of the model per engine
(540 MB for SmolLM2-135M in fp32); `serve_peers=False` releases it after each apply (the buffers
are reused, but nobody can read from them). docs/vllm.md has the measurements.

Sharded versions (a ZeRO-3 trainer's partitions; `layout=`): `ReshardReader.read_whole` lands every shard in
place in the staging tensors, q/k/v and gate/up as row blocks of fused buffers (`fused_staging`); each
shard's manifest re-checks its views of them before the apply.

Integrity: the bytes applied are the bytes the manifest describes. Each unit is checked against
its manifest checksum as it is handed to vLLM (xxh3, ~30 ms per 540 MB); a mismatch raises
`WeightIntegrityError` inside the apply, the engine refuses to generate, and the next update must
apply a whole good version. The hub's fetch has already verified every unit on arrival; this
check covers what happened to the staging buffers since (they are served to peers meanwhile).

Metrics per update (`SyncStats`): `sync/fetch_s` (hub fetch into staging), `sync/apply_s`
(vLLM's reload), `sync/pause_s` (the engine not generating because of the update: waiting for
its lock plus the apply and checks; with prefetch the fetch is not in it).
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from rlsync.core.transforms import VariantReader
from rlsync.hub import ReshardReader, Shard, ShardedLayout, zero_shard

from .engine import VllmEngine, WeightApplyError
from .staging import (Landing, WeightIntegrityError, check_variant_layout, checked_tensors, fused_buffers,
                      fused_staging, specs_of)
from .sync_stats import SyncStats

log = logging.getLogger(__name__)


class HubWeightStage:
    @dataclass(kw_only=True)
    class Config:
        serve_peers: bool = True
        """Keep each applied version in the staging buffers as a hub replica other engines read from."""
        verify: bool = True
        """Check the applied bytes against the manifest checksums on every update."""
        variant: str | None = None
        """Read this derived variant of each version (`bf16`, `int8`: rlsync/core/transforms.py), made once, read from
        peers (docs/derived.md). From the second fetch the staging is fused: `bf16` into a bf16 engine (`int8` into
        one started from the int8 checkpoint: `check_variant_layout`) is packed straight from it, with no copy."""

    def __init__(self, hub, engine: VllmEngine, model: str = "policy", config: "HubWeightStage.Config | None" = None,
                 *, layout: ShardedLayout | None = None):
        self.hub, self.engine, self.model = hub, engine, model
        self.config = config or HubWeightStage.Config()
        self._reader = ReshardReader(hub, model, layout) if layout is not None else None
        """Sharded versions: whole tensors reassembled from the trainer's partitions (None: whole versions)."""
        self.variant = VariantReader(hub, model, self.config.variant) if self.config.variant else None
        """The derived variant read instead of the version (None: the version as published)."""
        check_variant_layout(self.config.variant, engine.start_variant)
        if self.variant is not None and layout is not None:
            raise ValueError("a variant of a sharded (ZeRO-3) version is not supported: publish gathered")
        self._staging: dict[str, torch.Tensor] | None = None
        self._fused = False
        self._manifest = None
        self.staged_version: int | None = None
        """Version complete in the staging buffers (None: nothing, or a fetch is overwriting them)."""
        self._staged_fetch_s = 0.0
        self._staged_sources: dict[str, int] = {}
        self._staged_transports: dict[str, str] = {}
        self._fetch: threading.Thread | None = None
        self._fetch_error: BaseException | None = None
        self._lock = threading.Lock()
        """Held by apply_staged / update while they use the staging buffers; prefetch skips then."""
        self._follower: threading.Thread | None = None
        self._stop = threading.Event()
        self.on_landed = None
        """Called in the prefetch thread with each version complete in staging (rl_engine.py's in-flight build)."""
        self.hold_applied = False
        """Keep an applied version packed straight from fused staging there until `release_applied`: its check
        reads it back from the staging while the engine generates, so no prefetch may refill it (docs/verify.md)."""
        self._held: int | None = None

    # ------------------------------------------------------------------ fetch into staging
    def _fetch_into_staging(self, version, on_unit=None):
        self.staged_version = None  # the buffers are about to change
        if self._reader is not None:  # each shard lands in place in the (fused) staging tensors
            if self._staging is None:
                self._staging = fused_staging(self._reader.layout)
            res = self._reader.read_whole(version, into=self._staging)
            self._manifest = res  # its per-shard manifests re-check the staging at apply
            return res
        if self.variant is not None:
            self._fuse_staging()
            res = self.variant.fetch(version, into=self._staging, on_unit=on_unit)
        else:
            res = self.hub.fetch(self.model, version, into=self._staging, on_unit=on_unit)
        self._staging, self._manifest = res.tensors, res.manifest
        return res

    def _fuse_staging(self) -> None:
        """Lay the variant's staging out fused (q|k|v, gate|up rows of one buffer), once, from the first fetch's
        layout: in the engine's dtype the direct apply then packs each linear layer straight from it, no copy."""
        st = self._staging
        if st is None or self._fused:
            return
        from rlsync.hub import dtype_name

        self._fused = True
        fused = fused_buffers({n: (tuple(t.shape), dtype_name(t.dtype)) for n, t in st.items()})
        for rid in self.hub.held_ids():  # the old buffers' replica goes first: nobody reads them afterwards
            if rid.model == self.variant.variant_model and rid.slot == "live":
                self.hub.release(rid.model, rid.version)
        self._staging = fused

    def prefetch(self, version: int | str = "latest") -> bool:
        """Start fetching `version` into staging in the background; False if a fetch is running,
        an apply is reading the staging buffers, or that version is already staged or applied."""
        if not self._lock.acquire(blocking=False):
            return False  # apply_staged / update is reading or writing the staging buffers
        try:
            if self._held is not None or (self._fetch is not None and self._fetch.is_alive()):
                return False  # a check still reads the applied version here, or a fetch is writing
            if isinstance(version, int) and version in (self.staged_version, self.engine.version):
                return False
            self._fetch_error = None

            def run():
                try:
                    res = self._fetch_into_staging(version)
                    self._staged_fetch_s, self._staged_sources = res.seconds, dict(res.bytes_by_source)
                    self._staged_transports = dict(res.transports)
                    self.staged_version = res.version
                    if self.on_landed is not None:  # in-flight: build it beside the live weights, here
                        self.on_landed(res.version)
                except BaseException as e:  # noqa: BLE001 - surfaced by wait_staged / apply_staged
                    self._fetch_error = e
                    log.warning("prefetch of %s %s failed: %s", self.model, version, e)

            # started before it is published: `wait_staged` (the rollout thread, no lock) joins whatever
            # `_fetch` holds, and joining a thread not yet started raises (seen once in a grpo_real run)
            t = threading.Thread(target=run, name="rlsync-vllm-prefetch", daemon=True)
            t.start()
            self._fetch = t
            return True
        finally:
            self._lock.release()

    def follow(self, poll_s: float = 0.05) -> None:
        """Prefetch every new version as soon as it commits (a daemon thread asking the hub for
        `latest` every `poll_s`), so the fetch overlaps generation and an update pauses only to apply."""
        if self._follower is not None:
            return

        def loop():
            while not self._stop.wait(poll_s):
                try:
                    self.poll()
                except Exception as e:  # noqa: BLE001 - the next poll retries; updates surface errors
                    log.debug("follow: %s", e)

        self._follower = threading.Thread(target=loop, name="rlsync-vllm-follow", daemon=True)
        self._follower.start()

    def poll(self) -> bool:
        """Prefetch the hub's latest version when it is newer than what is staged or applied."""
        latest = self.hub.latest(self.model)
        held = max(v for v in (self.staged_version, self.engine.version, -1) if v is not None)
        return latest is not None and latest > held and self.prefetch(latest)

    def wait_staged(self, timeout_s: float | None = None) -> int | None:
        """Wait for the background fetch; returns the staged version (re-raises its error)."""
        t = self._fetch
        if t is not None:
            t.join(timeout_s)
            if t.is_alive():
                return None
        if self._fetch_error is not None:
            err, self._fetch_error = self._fetch_error, None
            raise err
        return self.staged_version

    # ------------------------------------------------------------------ apply
    def _checked(self, tensors: dict[str, torch.Tensor], manifest, order: Iterator[int]):
        return checked_tensors(tensors, manifest, order, verify=self.config.verify, what=self.model)

    def apply_staged(self) -> SyncStats | None:
        """Apply the staged version into the engine (waits for the batch in flight); None if nothing
        newer than the engine's version is staged or a fetch is still writing the buffers."""
        with self._lock:
            return self._apply_staged()

    def _apply_staged(self) -> SyncStats | None:
        if self._fetch is not None and self._fetch.is_alive():
            return None
        v = self.staged_version
        if v is None or v <= self.engine.version:
            return None
        names, specs, stream = self._staged_stream()
        t0 = time.monotonic()
        try:
            apply_s = self.engine.apply(stream, v, expect=names, specs=specs)
        except WeightIntegrityError:
            self._drop_staged(v)
            raise
        pause_s = time.monotonic() - t0
        self._after_apply(v)
        return SyncStats(version=v, fetch_s=self._staged_fetch_s, apply_s=apply_s, pause_s=pause_s,
                         nbytes=self._manifest.nbytes, bytes_by_source=self._staged_sources,
                         transports=self._staged_transports)

    def update(self, version: int | str = "latest", *, pipelined: bool = False) -> SyncStats:
        """Fetch `version` and apply it now; the engine does not generate meanwhile (a joining
        engine, a benchmark). In a running loop use `prefetch` + `apply_staged`: its pause is the
        apply alone.

        `pipelined`: hand each tensor to vLLM as soon as its units have landed, so fetch and apply
        overlap. On 2 shared cores this was slower than fetch-then-apply (the transfer threads and
        vLLM's repacking compete for the same cores; docs/vllm.md), so it is off by default. The
        first update of a stage is never pipelined (that fetch allocates the staging buffers).
        """
        self.wait_staged()
        with self._lock:
            return self._update(version, pipelined)

    def _update(self, version, pipelined: bool) -> SyncStats:
        t0 = time.monotonic()
        fetch = self._fetch
        if fetch is not None and fetch.is_alive():
            # the follower started a prefetch after `update` waited: it writes the same buffers. Seen in a
            # grpo_vllm run: fetching alongside it, then finding it alive, reported a version as applied
            # that was not (the engine tagged v5 batches with v4 weights, then never applied v5).
            fetch.join()
            self._fetch_error = None  # a failed prefetch: this update fetches again
        if version == "latest":
            version = self.hub.latest(self.model)
            if version is None:
                raise LookupError(f"the hub has no committed version of {self.model!r}")
        if version <= self.engine.version:
            return SyncStats(version=self.engine.version, fetch_s=0.0, apply_s=0.0, pause_s=0.0, nbytes=0)
        if self.staged_version != version and (self._staging is None or not pipelined or self._reader):
            res = self._fetch_into_staging(version)
            self._staged_fetch_s, self._staged_sources = res.seconds, dict(res.bytes_by_source)
            self._staged_transports = dict(res.transports)
            self.staged_version = res.version
        if self.staged_version == version:
            fetched = time.monotonic()
            stats = self._apply_staged()
            if stats is None:
                raise WeightApplyError(f"{self.model} v{version} staged but not applied (engine holds "
                                       f"v{self.engine.version})")
            stats.fetch_wait_s = fetched - t0
            return stats
        landing = Landing()
        box: dict = {}

        def run():
            try:
                box["res"] = self._fetch_into_staging(version, on_unit=landing.on_unit)
                landing.finish(box["res"].manifest, None)
            except BaseException as e:  # noqa: BLE001 - re-raised by the consuming iterator
                landing.finish(None, e)

        def order() -> Iterator[int]:
            i = 0
            while True:
                with landing.cond:
                    while i >= len(landing.ready) and not landing.done:
                        landing.cond.wait(1.0)
                    if landing.error is not None:
                        raise landing.error
                    if i >= len(landing.ready):
                        return
                    ti = landing.ready[i]
                    manifest = landing.manifest
                i += 1
                yield ti, manifest

        t0 = time.monotonic()
        fetcher = threading.Thread(target=run, name="rlsync-vllm-fetch", daemon=True)
        fetcher.start()
        try:
            # Wait for the first tensor before touching the engine: a fetch refused or failed at
            # once (a version lost meanwhile, say) leaves the engine's weights as they were.
            it = order()
            first = next(it, None)
            if first is None:
                raise WeightIntegrityError(f"{self.model} v{version}: the fetch returned no tensor")
            stream = self._checked(self._staging, first[1], itertools.chain((first[0],), (ti for ti, _ in it)))
            apply_s = self.engine.apply(stream, version, expect=[s.name for s in first[1].tensors],
                                        specs=specs_of(first[1]))
        finally:
            fetcher.join()
        res = box["res"]
        missing = {s.name for s in res.manifest.tensors} - {n for n in res.tensors}
        if missing:  # cannot happen unless the fetch handed back other buffers
            raise WeightIntegrityError(f"{self.model} v{version}: staging lacks {sorted(missing)[:5]}")
        self.staged_version = res.version
        self._staged_fetch_s, self._staged_sources = res.seconds, dict(res.bytes_by_source)
        self._after_apply(res.version)
        return SyncStats(version=res.version, fetch_s=res.seconds, apply_s=apply_s,
                         pause_s=time.monotonic() - t0, nbytes=res.nbytes, bytes_by_source=dict(res.bytes_by_source))

    def _staged_stream(self):
        """(names, (name, shape) specs, checked (name, tensor) stream) of the staged version."""
        m = self._manifest
        if self._reader is None:
            names = [s.name for s in m.tensors]
            return names, specs_of(m), self._checked(self._staging, m, iter(range(len(names))))
        specs = self._reader.layout.specs()
        return list(specs), tuple((n, shape) for n, (shape, _) in specs.items()), self._checked_shards(m)

    def _checked_shards(self, res) -> Iterator[tuple[str, torch.Tensor]]:
        """The staged whole tensors, after every shard's manifest has checked its views of them."""
        if self.config.verify:
            for r, manifest in sorted(res.manifests.items()):
                bad = manifest.verify(self._reader.views(r, self._staging), range(len(manifest.units)))
                if bad:
                    raise WeightIntegrityError(f"{self.model}: {len(bad)} unit(s) of shard {r} do not match the "
                                               "version's manifest checksums; update refused")
        for name in self._reader.layout.specs():
            yield name, self._staging[name]

    def _release(self, version: int) -> None:
        """Give back every shard of `version` this stage holds."""
        w = self._reader.layout.world if self._reader is not None else 0
        model = self.variant.variant_model if self.variant is not None else self.model
        for shard in [zero_shard(r, w) for r in range(w)] or [Shard()]:
            self.hub.release(model, version, shard)

    def _drop_staged(self, version: int) -> None:
        """Staging bytes failed their checksums: stop serving them (no peer may read them) and forget
        them, so the next update fetches the version again."""
        log.error("%s v%d: staging buffers do not match the manifest; replica withdrawn", self.model, version)
        self.staged_version = None
        try:
            self._release(version)
        except Exception as e:  # noqa: BLE001 - the integrity error is what the caller must see
            log.warning("could not withdraw the corrupt replica of %s v%d: %s", self.model, version, e)

    def _after_apply(self, version: int) -> None:
        self._held = version if self.hold_applied and self._fused else None  # set under the lock: no gap
        if not self.config.serve_peers:
            self._release(version)
            self.staged_version = None

    def release_applied(self, version: int) -> None:
        """A check has read `version` back from the staging: prefetches may refill it again."""
        if self._held is not None and self._held <= version:
            self._held = None

    def close(self) -> None:
        """Stop following and wait for a background fetch; the caller leaves the hub."""
        self._stop.set()
        if self._follower is not None:
            self._follower.join()
        self._follower, self._stop = None, threading.Event()
        t = self._fetch
        if t is not None:
            t.join()

