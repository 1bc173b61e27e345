"""`HubClient`: what a trainer or rollout worker uses to publish, fetch and release weights.

    hub = HubClient(address, token=token)
    hub.join(Location(dc="dc0", host="node3"))
    hub.publish("policy", 7, dict(model.named_parameters()))   # registers live tensors, no copy
    hub.release("policy", 7)                                   # before the optimizer writes them
    got = hub.fetch("policy", "latest", into=params)           # pulls from peers, verifies units
    hub.leave()

Each client runs a data-plane server that serves the units of every replica it holds, including
fetches still in progress (relays). Tensors must be contiguous host tensors; names, shapes and
dtypes of `into` must match the version's manifest exactly.

Mutability contract: tensors you published, or fetched into, must not change until `release`
returns. `fetch(into=...)` releases any replica that lives in those same buffers first.

One facade over parts that each hold only what they need (etcd's client/v3 shape):
    replicas.py  Replicas   the local replica book: the data-plane store + what the hub was told of it
    session.py   Session    join / leave / heartbeat / re-join, the control channel and `call`
    publish.py   Publisher  publish, publish_async, release (re-register, offload-seed), hand-off on leave
    fetch.py     Fetcher    fetch: plan, relay, parallel data-plane pulls, re-plan; `FetchResult`
    deltas.py    Deltas     publish_delta, fetch_delta (a chain of deltas onto the held version), adopt
    partial.py   fetch_units: some units of a shard (resharding reads)
    derived.py   Variants   fetch_variant: derive a variant once (the hub's lease) or fetch it from its holders
Each part names the others it calls in its constructor: the circle of mixins calling one another
through `self` is gone. Callers use the `HubClient` methods; the parts are attributes for tools and
tests (`client.session.rpc`, `client.replicas.held`).
"""
from __future__ import annotations

import functools
import logging
import os
from concurrent.futures import Future
from typing import Callable

import torch

from rlsync.hub import errors as E
from rlsync.hub.client.config import ClientConfig
from rlsync.hub.client.deltas import Deltas
from rlsync.hub.client.derived import Variants
from rlsync.hub.client.fetch import FetchResult, Fetcher
from rlsync.hub.client.partial import PartialResult, fetch_units
from rlsync.hub.client.publish import Publisher
from rlsync.hub.client.replicas import Replicas
from rlsync.hub.client.session import Session
from rlsync.hub.dataplane.store import ReplicaStore
from rlsync.hub.model.location import Location
from rlsync.hub.model.manifest import Manifest, ManifestConfig
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.shard import Shard
from rlsync.hub.protocol.args import check_args
from rlsync.hub.protocol.rpc import read_token

__all__ = ["ClientConfig", "FetchResult", "HubClient", "ReplicaId"]

log = logging.getLogger(__name__)


def _doc(part_method):
    """The facade's method carries the part's docstring (help(HubClient.fetch) reads the real one)."""
    return functools.wraps(part_method, assigned=("__doc__",), updated=())


class HubClient:
    def __init__(self, address: str, token: str | None = None, *, token_file: str | None = None,
                 config: ClientConfig | None = None,
                 on_fetch: Callable[[FetchResult], None] | None = None) -> None:
        """`on_fetch`: called with every completed fetch's `FetchResult` (the caller's and the ones the
        client starts itself, e.g. a seed worker following `latest`), after the replica is held."""
        if token is None:
            token = read_token(token_file) if token_file is not None else os.environ.get("RLSYNC_HUB_TOKEN")
        if not token:
            raise E.AuthError("HubClient needs the hub's token (token=, token_file= or $RLSYNC_HUB_TOKEN)")
        if not isinstance(token, str) or not isinstance(config or ClientConfig(), ClientConfig):
            raise E.InvalidArgumentError("token must be a str and config a ClientConfig")
        self.address, self.cfg = address, config or ClientConfig()
        self.on_fetch = on_fetch
        self.replicas = Replicas()
        self.session = Session(address, token, self.cfg, self.replicas)
        self.publisher = Publisher(self.session, self.replicas, self.cfg)
        self.fetcher = Fetcher(self.session, self.replicas, self.publisher, self.cfg, self._fetched)
        self.deltas = Deltas(self.session, self.replicas, self.fetcher, self.publisher, self.cfg)
        self.variants = Variants(self.session, self.fetcher, self.publisher)
        self.session.on_task = lambda model, version, shard: self.fetcher.fetch(model, version, shard=shard)

    def _fetched(self, result: FetchResult) -> None:
        if self.on_fetch is not None:
            self.on_fetch(result)

    # ------------------------------------------------------------------ identity
    @property
    def worker_id(self) -> str | None:
        """This worker's hub id once joined (None before join and after leave)."""
        return self.session.worker_id

    @property
    def location(self) -> Location | None:
        return self.session.location

    @property
    def hub_id(self) -> str | None:
        """The hub's id (kept in its journal across restarts), once joined: a gateway's home (docs/scale.md)."""
        return self.session.hub_id

    @property
    def rejoined_at(self) -> float | None:
        """When the last re-join (with its re-registrations) finished (time.monotonic())."""
        return self.session.rejoined_at

    @property
    def store(self) -> ReplicaStore:
        """The bytes this worker's data-plane server serves (read-only use: tools and tests)."""
        return self.replicas.store

    @property
    def token(self) -> str:
        """The credential this client presents: what another process of the same worker (a TP engine's
        ranks) joins with. Read-only: a client's credential does not change."""
        return self.session.token

    # ------------------------------------------------------------------ membership
    @_doc(Session.join)
    def join(self, location: Location | None = None, name: str = "worker", *, role: str = "worker",
             follow: bool = False) -> str:
        return self.session.join(location, name, role=role, follow=follow)

    def leave(self, deadline_s: float | None = 0.0) -> None:
        """Leave the hub: stop serving and drop every replica held here.

        With notice (`deadline_s` > 0, e.g. a spot preemption warning), retention runs first: each
        replica that is the last full copy of a retained version is handed off — to a reader already
        fetching it, or to a seed worker the hub picks — before this worker goes, within the
        deadline. Without notice (0) it just goes; a version only it held is then lost.
        """
        if self.session.worker_id is not None:
            self.publisher.drain()  # publishes in flight land (or fail) before the worker goes
            if deadline_s:
                self.publisher.handoff_all(deadline_s)
        self.session.leave()

    def close(self) -> None:
        self.leave()

    def __enter__(self) -> "HubClient":
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    # ------------------------------------------------------------------ publish / release
    @_doc(Publisher.publish)
    def publish(self, model: str, version: int, tensors: dict[str, torch.Tensor], shard: Shard = Shard(),
                manifest_config: ManifestConfig | None = None) -> bool:
        return self.publisher.publish(model, version, tensors, shard, manifest_config)

    @_doc(Publisher.publish_async)
    def publish_async(self, model: str, version: int, tensors: dict[str, torch.Tensor], shard: Shard = Shard(),
                      manifest_config: ManifestConfig | None = None) -> "Future[bool]":
        return self.publisher.publish_async(model, version, tensors, shard, manifest_config)

    @_doc(Publisher.release)
    def release(self, model: str, version: int, shard: Shard = Shard()) -> None:
        self.publisher.release(model, version, shard)

    # ------------------------------------------------------------------ fetch
    @_doc(Fetcher.fetch)
    def fetch(self, model: str, version: int | str = "latest", into: dict[str, torch.Tensor] | None = None,
              shard: Shard = Shard(), group: tuple[str, int] | None = None,
              on_unit: Callable[[Manifest, int], None] | None = None) -> FetchResult:
        return self.fetcher.fetch(model, version, into, shard, group, on_unit)

    @_doc(fetch_units)
    def fetch_units(self, model: str, version: int | str, shard: Shard, into: dict[str, torch.Tensor],
                    want: Callable[[Manifest], list[int]]) -> PartialResult:
        return fetch_units(self.fetcher, model, version, shard, into, want)

    # ------------------------------------------------------------------ deltas
    @_doc(Deltas.publish_delta)
    def publish_delta(self, model: str, version: int, tensors: dict[str, torch.Tensor], shard: Shard = Shard(),
                      keep: int = 4) -> dict:
        return self.deltas.publish_delta(model, version, tensors, shard, keep)

    @_doc(Deltas.publish_fetched_delta)
    def publish_fetched_delta(self, model: str, version: int, delta: dict[str, torch.Tensor], shard: Shard = Shard(),
                              keep: int = 4) -> int:
        return self.deltas.publish_fetched_delta(model, version, delta, shard, keep)

    @_doc(Deltas.fetch_delta)
    def fetch_delta(self, model: str, version: int | str = "latest", into: dict[str, torch.Tensor] | None = None,
                    shard: Shard = Shard(), keep: int = 2, fallback: bool = False,
                    keep_base: bool = False) -> FetchResult:
        return self.deltas.fetch_delta(model, version, into, shard, keep, fallback, keep_base)

    @_doc(Deltas.adopt)
    def adopt(self, model: str, version: int, tensors: dict[str, torch.Tensor], shard: Shard = Shard()) -> None:
        self.deltas.adopt(model, version, tensors, shard)

    # ------------------------------------------------------------------ variants
    @_doc(Variants.fetch_variant)
    def fetch_variant(self, model: str, version: int | str, transform: str,
                      make: Callable[[int, dict | None], dict[str, torch.Tensor]],
                      into: dict[str, torch.Tensor] | None = None, shard: Shard = Shard(),
                      params: dict | None = None, on_unit=None) -> FetchResult:
        return self.variants.fetch_variant(model, version, transform, make, into, shard, params, on_unit)

    @_doc(Variants.derived_from)
    def derived_from(self, model: str, version: int) -> dict:
        return self.variants.derived_from(model, version)

    # ------------------------------------------------------------------ seams for tests and tools
    def observe_rpc(self, fn: Callable[[str, dict, object], None]) -> Callable[[], None]:
        """Call `fn(op, args, result)` after each control call this client's channel made and the hub
        answered (not its heartbeats). Returns a function that stops it."""
        self.session.rpc.observers.append(fn)
        return lambda: self.session.rpc.observers.remove(fn)

    def set_pull_fault(self, fn: Callable | None) -> None:
        """Fault injection for tests: every data-plane pull of a fetch goes through
        `fn(sources, dest, pull)`, which may change the sources, call `pull(sources)` (the real pull:
        returns (failed replica ids, errors)) and return (failed, errors) of its own. None: off."""
        self.fetcher.pull_fault = fn

    # ------------------------------------------------------------------ queries
    def latest(self, model: str) -> int | None:
        return self.session.call("latest", model=model)

    def wait_latest(self, model: str, at_least: int, timeout_s: float = 30.0) -> int | None:
        """`latest(model)` as soon as it is >= `at_least` (the hub parks the reply until that version
        commits), or after `timeout_s` whatever it is then (None: nothing of `model` committed yet).
        A timeout is not an error: compare and decide. One call instead of polling `latest`.

        Across a hub restart the call is sent again and the new hub parks it afresh; a hub that stays
        unreachable is HubUnavailableError after `config.hub_deadline_s`, never a hang."""
        args = check_args("wait_latest", {"model": model, "at_least": at_least, "timeout_s": timeout_s})
        # One try lasts the wait plus an ordinary reply time: a parked reply is not a dead hub.
        return self.session.call("wait_latest", attempt_s=args["timeout_s"] + self.cfg.rpc_timeout_s, **args)

    def versions(self, model: str) -> dict:
        """{"latest", "committed": every version number committed (ascending), "retained": those the
        retention policy keeps fetchable, "held": those some worker holds a full replica of now}."""
        return self.session.call("versions", model=model)

    def stats(self) -> dict:
        return self.session.call("stats")

    def models(self) -> dict[str, int | None]:
        """{model: latest} of every model this client's credential may list (a tenant's: only its own
        and those it may read; the hub token's: all). docs/tenants.md"""
        return self.session.call("models")

    # ------------------------------------------------------------------ per-version annotations
    def annotate(self, model: str, version: int, key: str, value) -> bool:
        """Attach a small JSON-able `value` (<= 16 KiB packed) under `key` to committed (model, version).

        The hub keeps it with the version (journaled: it survives a hub restart or failover) and drops
        it when the version is forgotten; it never interprets it. A key is written once: the same value
        again returns False (a retry), another value is VersionError. Too big or not JSON-able:
        InvalidArgumentError before anything is sent; an unknown model or version: UnknownModelError /
        VersionNotFoundError. A refusal changes nothing. True when the annotation is new."""
        args = check_args("annotate", {"model": model, "version": version, "key": key, "value": value})
        return self.session.call("annotate", **args)

    def annotations(self, model: str, version: int) -> dict:
        """Every annotation of committed (model, version), {key: value} ({} if none)."""
        return self.session.call("annotations", **check_args("annotations", {"model": model, "version": version}))

    def held(self) -> list[str]:
        """Wire ids (`worker:model:version:shard:slot`) of the replicas this worker holds."""
        return sorted(self.replicas.held)

    def held_ids(self) -> list[ReplicaId]:
        """The replicas this worker holds, typed: read `.model`, `.version`, `.slot`; never parse `held()`."""
        return self.replicas.ids(self.worker_id)
