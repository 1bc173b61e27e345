"""Federation: one hub per DC, one version history per model, each version crossing into a DC once.

Design (docs/scale.md, "Federation"): every model has a *home* hub, the hub of the DC where its
trainer publishes; only the home hub commits new versions of it (one writer: version numbers and
manifests come from one journal). Every other DC runs its own ordinary hub and one `Gateway`:

- the gateway is a client of the home hub, joined with a location in ITS DC, and a client of its
  own DC's hub. It follows the home's `latest`; for a new version it fetches every shard from the
  home DC once (a plan made by the home hub: the only bytes that cross the DC link), verifies it
  unit by unit (the client does), and then publishes the identical manifest, as the same version
  number, to its own hub: that publish is the version's commit in this DC (journaled there first).
- readers in the DC know only their own hub, which plans every read inside the DC: from the
  gateway's copy and relays of it. So a version crosses into the DC exactly once per gateway.
- a DC's hub commits a version only when the gateway holds every unit of every shard (the hub's
  own rule: a version commits when its whole tp x pp group is published), so it never serves a
  torn or partial one; a peer DC's committed versions are always versions the home committed, with
  the same bytes (the gateway refuses a version whose manifest it cannot reproduce exactly).
- a DC whose hub (or gateway) is down stops receiving new versions; nothing else changes: the home
  and the other DCs keep training and reading. When its hub returns, the gateway re-joins
  (re-registering what it holds, as any client) and publishes the home's newest version: the DC
  catches up. Versions the home committed and superseded meanwhile are skipped there (never visible
  in that DC, never partly so): retention keeps only the newest ones anyway.
- deltas (docs/deltas.md): a gateway holding v-1 asks the home hub for v by `fetch_delta` (v lands
  in new buffers: v-1's still serve this DC), so only the delta crosses, decoded and checked against
  v's checksums; it publishes that delta object here before v, so this DC's readers holding v-1 get
  the delta from this DC. No v-1 here, no chain at home, a failed delta: v crosses in full.

What "agree" means, then: each DC's committed versions are a subset of the home's, in the same
order, with identical manifests; the home's newest version reaches every DC whose hub and gateway
are up; a commit is never visible in one DC and lost in another (it is in the home's journal before
any peer sees it). A commit is NOT visible everywhere at one instant: a peer sees it one transfer
later (a synchronous commit would let one DC's outage stop every other DC's training).

    gw = Gateway(HubClient(home_addr, token=t0), HubClient(local_addr, token=t1), GatewayConfig(models=("policy",)))
    gw.start(Location(dc="dc1", rack="gw", host="gw-host")); ...; gw.stop()
    python -m rlsync.hub.federation --home tcp://10.0.0.1:5555 --home-token-file t0 \\
        --local tcp://10.1.0.1:5555 --local-token-file t1 --dc dc1 --model policy --stats gw.json
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from rlsync.hub import errors as E
from rlsync.hub.client import ClientConfig, FetchResult, HubClient
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import build_manifest
from rlsync.hub.model.shard import Shard
from rlsync.hub.protocol.args import check_value

log = logging.getLogger("rlsync.hub.federation")


@dataclass(kw_only=True, slots=True)
class GatewayConfig:
    models: tuple[str, ...] = ("policy",)
    """The models this DC follows from their home hub (one home per gateway)."""
    group: tuple[int, int] = (1, 1)
    """(tp_size, pp_size) of the followed models: the gateway fetches and publishes every shard."""
    poll_s: float = 0.05
    """How often the gateway asks the home hub for `latest` (one small RPC per model)."""
    retry_s: float = 1.0
    """After a failure (a hub unreachable past the client's deadline), wait this long and try again."""
    deltas: bool = True
    """Holding v-1, bring v across as its delta when the home hub says so (`fetch_delta`), and publish
    that delta in this DC before v, so this DC's readers holding v-1 fetch it from here (docs/deltas.md)."""

    def __post_init__(self) -> None:
        # Refused here, typed: a model the hub refuses would be warned about once per poll forever,
        # and a poll period <= 0 spins the gateway's thread.
        if not self.models:
            raise E.InvalidArgumentError("GatewayConfig.models must name at least one model")
        for m in self.models:
            try:
                check_value("latest", "model", m)
            except E.InvalidArgumentError as e:
                raise E.InvalidArgumentError(f"GatewayConfig.models: {str(e).removeprefix('latest: ')}") from None
        if len(self.group) != 2 or not all(type(x) is int and x >= 1 for x in self.group):
            raise E.InvalidArgumentError(f"GatewayConfig.group must be (tp_size, pp_size) >= 1, got {self.group!r}")
        for name in ("poll_s", "retry_s"):
            v = getattr(self, name)
            if type(v) not in (int, float) or not 0 < v < float("inf"):
                raise E.InvalidArgumentError(f"GatewayConfig.{name} must be a finite number > 0, got {v!r}")

    def shards(self) -> list[Shard]:
        tp, pp = self.group
        return [Shard(t, p, tp, pp) for p in range(pp) for t in range(tp)]


@dataclass(slots=True)
class Replicated:
    """One version this gateway brought into its DC."""
    model: str
    version: int
    nbytes: int
    """Bytes of the version (all shards)."""
    cross_bytes: int
    """Bytes that crossed the DC link for it: everything the home-DC sources served to the gateway."""
    bytes_by_source: dict
    """Home hub's worker id -> bytes it served to this gateway (all shards)."""
    fetch_s: float
    publish_s: float
    committed_at: float
    """time.time() of the local commit."""
    mode: str = "full"
    """How v crossed: 'full' (its units) or 'delta' (the chain of deltas onto the version held here)."""
    deltas: list = field(default_factory=list)
    """Delta versions of the model this gateway published in its DC with v (before v)."""


@dataclass(slots=True)
class GatewayStats:
    replicated: list[Replicated] = field(default_factory=list)
    skipped: list[tuple[str, int, str]] = field(default_factory=list)
    """(model, version, why): versions the home committed that this DC will never see."""
    failures: list[str] = field(default_factory=list)
    failures_total: int = 0
    """How many failures so far (`failures` keeps the last ones' text)."""
    home_wid: str | None = None
    local_wid: str | None = None

    def to_json(self) -> dict:
        return {"home_wid": self.home_wid, "local_wid": self.local_wid,
                "replicated": [dict(model=r.model, version=r.version, nbytes=r.nbytes, cross_bytes=r.cross_bytes,
                                    bytes_by_source=r.bytes_by_source, fetch_s=round(r.fetch_s, 4),
                                    publish_s=round(r.publish_s, 4), committed_at=r.committed_at, mode=r.mode,
                                    deltas=r.deltas)
                               for r in self.replicated],
                "skipped": [list(s) for s in self.skipped], "failures": self.failures[-20:],
                "failures_total": self.failures_total}


@dataclass(slots=True)
class _Pending:
    version: int
    results: dict
    """shard key -> FetchResult (the tensors the gateway now holds)."""
    published: list
    """shard keys (and 'd<v>:<shard key>' for deltas) already published to this DC's hub."""
    fetch_s: float
    tried: list = field(default_factory=list)
    """shard keys whose publish here failed unanswered (the hub went away): it may have landed."""


class Gateway:
    """One DC's door to the home hub of its followed models (the module docstring has the design)."""

    def __init__(self, home: HubClient, local: HubClient, cfg: GatewayConfig | None = None,
                 on_change=None) -> None:
        self.home, self.local = home, local
        self.cfg = cfg or GatewayConfig()
        self.stats = GatewayStats()
        self._on_change = on_change
        self._held: dict[str, int] = {}
        """model -> the version this gateway holds and committed in its DC."""
        self._bufs: dict[str, dict] = {}
        """model -> {shard key: the tensors holding `_held[model]`} (a delta's base)."""
        self._pending: dict[str, _Pending] = {}
        """model -> a version fetched from the home, not yet committed here."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def start(self, location: Location, name: str = "gateway", loop: bool = True) -> "Gateway":
        """Join both hubs; with `loop` follow the home in a thread (else the caller calls `step`)."""
        self.stats.home_wid = self.home.join(location, f"{name}@{location.dc}")
        # Every publish here says which hub it brings versions from: this DC's hub refuses a second history
        # of the model (a trainer publishing it here, or a gateway from another home: hub/state/homes.py).
        self.local.session.publishes_for = self.home.hub_id
        self.stats.local_wid = self.local.join(location, name)
        if not loop:
            return self
        self._thread = threading.Thread(target=self._loop, name="rlsync-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self, leave: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if leave:
            for c in (self.local, self.home):
                try:
                    c.leave()
                except E.HubError as e:
                    log.warning("gateway: leave failed: %s", e)

    def _loop(self) -> None:
        while not self._stop.is_set():
            wait = self.cfg.poll_s
            for model in self.cfg.models:
                try:
                    self.step(model)
                except E.HubError as e:  # a hub unreachable past the deadline, a version gone: try again
                    with self._lock:
                        self.stats.failures.append(f"{model}: {type(e).__name__}: {e}"[:300])
                        self.stats.failures_total += 1
                    log.warning("gateway: %s: %s: %s", model, type(e).__name__, e)
                    wait = self.cfg.retry_s
                    self._changed()
            self._stop.wait(wait)

    # ------------------------------------------------------------------ one step
    def step(self, model: str) -> int | None:
        """Bring the home's newest committed version of `model` into this DC if it is not here yet;
        returns the version committed here by this step (None: nothing new)."""
        pend = self._pending.get(model)
        try:
            latest = self.home.latest(model)
        except E.UnknownModelError:  # nothing published at home yet
            return None
        if latest is None:
            return None
        if pend is not None and pend.version < latest and not pend.published and not pend.tried:
            self._skip(model, pend.version, f"superseded by v{latest} before it could commit here")
            self._drop_pending(model)
            pend = None
        if pend is None:
            if latest <= self._held.get(model, -1):
                return None
            here = self._local_latest(model)
            if here is not None and latest <= here:  # committed here already (by an earlier gateway run)
                return None
            pend = self._fetch(model, latest)
            if pend is None:
                return None
        return self._commit(model, pend)

    def _adopt(self, model: str, version: int, tensors: dict, shard: Shard) -> bool:
        """Our own publish landed before the hub died unanswered (v is in its journal): hold it as ours."""
        try:
            self.local.adopt(model, version, tensors, shard)
            return True
        except (E.VersionError, E.VersionNotFoundError, E.ManifestMismatchError) as e:
            log.info("gateway: %s v%d here is not the copy this gateway sent: %s", model, version, e)
            return False

    def _local_latest(self, model: str) -> int | None:
        try:
            return self.local.latest(model)
        except E.UnknownModelError:
            return None

    def _fetch(self, model: str, version: int) -> "_Pending | None":
        t0 = time.monotonic()
        got: dict[str, FetchResult] = {}
        try:
            for shard in self.cfg.shards():
                got[shard.key] = self._pull(model, version, shard)
        except (E.VersionNotRetainedError, E.VersionLostError, E.VersionNotFoundError) as e:
            # The home moved on (or lost it) while we read: the next poll takes the newer version.
            self._skip(model, version, f"{type(e).__name__}: {e}"[:200])
            self._release_home(model, version, list(got))
            return None
        for key, r in got.items():  # publish builds the manifest again: it must be the home's, unit for unit
            if build_manifest(r.tensors, self.local.cfg.manifest) != r.manifest:
                self._skip(model, version, f"{key}: manifest differs from the home's (another ManifestConfig)")
                self._release_home(model, version, list(got))
                raise E.ManifestMismatchError(
                    f"gateway: {model!r} v{version} {key}: this DC's ManifestConfig cuts other units than the "
                    "home's; configure the gateway's client with the trainer's ManifestConfig")
        pend = self._pending[model] = _Pending(version, got, [], time.monotonic() - t0)
        return pend

    def _pull(self, model: str, version: int, shard: Shard) -> FetchResult:
        """v of one shard from the home: by its delta onto the copy held here if the home hub says so
        (never written: it still serves v-1 in this DC; bit-exact against v's checksums, else in full),
        else in full (nothing held, no chain, or a chain dearer than v)."""
        base = self._bufs.get(model, {}).get(shard.key) if self.cfg.deltas else None
        if base is None:
            return self.home.fetch(model, version, shard=shard)
        return self.home.fetch_delta(model, version, into=base, shard=shard, fallback=True, keep_base=True)

    def _publish_deltas(self, model: str, pend: "_Pending", shard: Shard) -> list[int]:
        """Publish in this DC the deltas v crossed as (before v: a reader that sees v finds its delta).
        A delta this hub refuses only costs this DC's readers a full read of v here: logged, not fatal."""
        done = []
        for dv, tensors in sorted((pend.results[shard.key].deltas or {}).items()):
            key = f"d{dv}:{shard.key}"
            if key not in pend.published:
                try:
                    self.local.publish_fetched_delta(model, dv, tensors, shard)
                except (E.VersionError, E.ManifestMismatchError) as e:
                    log.warning("gateway: %s delta v%d not published in this DC: %s", model, dv, e)
                pend.published.append(key)  # (a HubUnavailableError above: the next step retries)
            done.append(dv)
        return done

    def _commit(self, model: str, pend: "_Pending") -> int | None:
        t0 = time.monotonic()
        deltas: list[int] = []
        for shard in self.cfg.shards():
            deltas += self._publish_deltas(model, pend, shard)
            if shard.key not in pend.published:
                tensors = pend.results[shard.key].tensors
                try:
                    self.local.publish(model, pend.version, tensors, shard)
                except E.HubUnavailableError:
                    pend.tried.append(shard.key)
                    raise
                except E.VersionError:
                    here = self._local_latest(model)
                    if here is None or here < pend.version:
                        raise
                    if not (shard.key in pend.tried and self._adopt(model, pend.version, tensors, shard)):
                        # Committed here already by someone else (another gateway of this DC): drop ours.
                        self._skip(model, pend.version, f"already committed in this DC (latest v{here})")
                        self._drop_pending(model)
                        return None
                pend.published.append(shard.key)  # (a HubUnavailableError above: the next step retries)
        here = self._local_latest(model)
        if here is None or here < pend.version:
            raise E.HubError(f"gateway: {model!r} v{pend.version}: every shard published but not committed here "
                             f"(this DC's hub says latest={here}): a hub restart lost part of the group")
        by_source: dict[str, int] = {}
        for r in pend.results.values():
            for w, n in r.bytes_by_source.items():
                by_source[w] = by_source.get(w, 0) + n
        modes = {r.mode for r in pend.results.values()}
        rec = Replicated(model, pend.version, sum(r.manifest.nbytes for r in pend.results.values()),
                         sum(by_source.values()), by_source, pend.fetch_s, time.monotonic() - t0, time.time(),
                         mode="delta" if modes == {"delta"} else "full", deltas=sorted(set(deltas)))
        old = self._held.get(model)
        self._held[model] = pend.version
        self._bufs[model] = {k: r.tensors for k, r in pend.results.items()}
        del self._pending[model]
        with self._lock:
            self.stats.replicated.append(rec)
        log.info("gateway: %s v%d committed in this DC (%d bytes crossed)", model, pend.version, rec.cross_bytes)
        if old is not None:
            self._release_later(model, old)
        self._changed()
        return pend.version

    # ------------------------------------------------------------------ letting go
    def _release_later(self, model: str, version: int) -> None:
        """Release the previous version on both hubs in the background (a release waits for reads)."""
        def run() -> None:
            for c in (self.local, self.home):
                for shard in self.cfg.shards():
                    try:
                        c.release(model, version, shard)
                    except E.HubError as e:
                        log.info("gateway: release of %s v%d %s: %s", model, version, shard.key, e)
        threading.Thread(target=run, name="rlsync-gateway-release", daemon=True).start()

    def _release_home(self, model: str, version: int, keys: list[str]) -> None:
        for shard in self.cfg.shards():
            if shard.key in keys:
                try:
                    self.home.release(model, version, shard)
                except E.HubError as e:
                    log.info("gateway: release of %s v%d on the home hub: %s", model, version, e)

    def _drop_pending(self, model: str) -> None:
        pend = self._pending.pop(model)
        self._release_home(model, pend.version, list(pend.results))

    def _skip(self, model: str, version: int, why: str) -> None:
        with self._lock:
            self.stats.skipped.append((model, version, why))
        log.info("gateway: %s v%d skipped: %s", model, version, why)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self)
