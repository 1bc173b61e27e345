"""Variants of a version (hub/state/derived.py): derive it once, or fetch it from whoever holds it.

    res = hub.fetch_variant("policy", 7, "bf16", make=lambda v, into: cast_into(v, into), into=buffers)
    res.mode    # "derived": this worker held the lease, made it and published it as `policy@bf16` v7
                # "full" / "held": another worker made it; it came from the holders like any version

The hub's `derive` answers "derive" to the first caller (it holds the lease) and parks every other caller
until the variant is published (then "fetch") or the lease ends (the deriver failed, left or died: then the
next caller derives). `make(version, into)` is the caller's derivation: it returns the variant's tensors
(written into `into` when given), typically by fetching the base version and applying a registered transform
(rlsync/core/transforms.py); the hub knows only the names. A `make` that raises gives the lease back.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import torch

from rlsync.hub import errors as E
from rlsync.hub.client.fetch import FetchResult, Fetcher
from rlsync.hub.client.publish import Publisher
from rlsync.hub.client.session import Session
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.model.shard import Shard
from rlsync.hub.protocol.args import check_value

log = logging.getLogger(__name__)


class Variants:
    def __init__(self, session: Session, fetcher: Fetcher, publisher: Publisher) -> None:
        self.session, self.fetcher, self.publisher = session, fetcher, publisher

    def lease(self, model: str, version: int | str, transform: str, shard: Shard = Shard(),
              params: dict | None = None, try_s: float = 10.0, deadline_s: float = 300.0) -> dict:
        """The hub's answer for (variant, version): {"mode": "derive" | "fetch", "model", "version"}, after
        waiting (parked at the hub, one try per `try_s`) while another worker derives it."""
        wid = self.session.need_join()
        if params is not None:
            check_value("derive", "params", params)
        end = time.monotonic() + deadline_s
        while True:
            try:
                return self.session.call("derive", wid=wid, model=model, version=version, transform=transform,
                                         shard=shard.to_wire(), params=params, attempt_s=try_s)
            except E.HolderWaitTimeoutError:
                if time.monotonic() >= end:
                    raise
                log.info("%s@%s %s: still being derived by another worker", model, transform, version)

    def fetch_variant(self, model: str, version: int | str, transform: str,
                      make: Callable[[int, dict | None], dict[str, torch.Tensor]],
                      into: dict[str, torch.Tensor] | None = None, shard: Shard = Shard(),
                      params: dict | None = None, on_unit=None) -> FetchResult:
        """Variant `transform` of (model, version) into `into`: derived here if this worker is the first to
        need it (`mode` "derived"; published as `model@transform` v: peers read it from here), else fetched
        from its holders. The published tensors follow the mutability contract of any replica."""
        for attempt in range(3):
            r = self.lease(model, version, transform, shard, params)
            dm, ver = r["model"], r["version"]
            if r["mode"] == "fetch":
                try:
                    return self.fetcher.fetch(dm, ver, into, shard, on_unit=on_unit)
                except (E.VersionLostError, E.VersionNotRetainedError):  # its holders let it go: ask again
                    if attempt == 2:
                        raise
                    continue
            return self._derive(dm, ver, make, into, shard)
        raise AssertionError("unreachable")

    def _derive(self, dm: str, ver: int, make, into, shard: Shard) -> FetchResult:
        t0 = time.monotonic()
        try:
            if into is not None:  # the mutability contract: what these buffers held goes first
                self.fetcher.release_overlapping(into)
            tensors = make(ver, into)
            self.publisher.publish(dm, ver, tensors, shard)
        except BaseException:
            try:
                self.session.call("derive_abandon", wid=self.session.worker_id, model=dm, version=ver,
                                  shard=shard.to_wire())
            except E.HubError as e:  # the lease ends with this worker anyway
                log.warning("could not give back the lease on %s v%d: %s", dm, ver, e)
            raise
        rep = self.publisher.replicas.store.get(ReplicaId(self.session.worker_id, dm, ver, shard.key).wire)
        return FetchResult(ver, tensors, {}, {}, time.monotonic() - t0, 0, manifest=rep.manifest if rep else None,
                           mode="derived")

    def derived_from(self, model: str, version: int) -> dict:
        """The hub's record of variant `model` v: {"model", "version", "transform", "params"}."""
        return self.session.call("derived_from", model=model, version=version)
