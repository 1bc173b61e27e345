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

One class, split by protocol into mixins (one file each; they share the attributes set here):
    client_session.py  Session     join / leave / heartbeat / re-join, the control-RPC wrapper `_call`
    client_publish.py  Publishing  publish, release (re-register, offload-seed)
    client_fetch.py    Fetching    fetch: plan, relay, parallel data-plane pulls, re-plan; `FetchResult`
    client_delta.py    DeltaSync   publish_delta, fetch_delta (a chain of deltas onto the held version)
Mixins rather than composed helpers: the protocols share one replica store, one held-replica table
and one re-join lock, and callers use `HubClient` methods directly.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from rlsync.hub import errors as E
from rlsync.hub.dataplane.config import DataPlaneConfig
from rlsync.hub.client.config import ClientConfig
from rlsync.hub.client.deltas import DeltaSync
from rlsync.hub.client.fetch import FetchResult, Fetching
from rlsync.hub.client.manifests import ManifestCache
from rlsync.hub.client.publish import Publishing
from rlsync.hub.client.session import Session
from rlsync.hub.dataplane.transfer import DataServer
from rlsync.hub.model.location import Location
from rlsync.hub.model.replica_id import ReplicaId
from rlsync.hub.protocol.rpc import RpcChannel, read_token
from rlsync.hub.model.shard import Shard
from rlsync.hub.dataplane.store import ReplicaStore
from rlsync.hub.protocol.tickets import ReaderKey
from rlsync.hub.protocol.args import check_args

__all__ = ["ClientConfig", "FetchResult", "HubClient", "ReplicaId"]

log = logging.getLogger(__name__)


class HubClient(Session, Publishing, Fetching, DeltaSync):
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
        self._token = token
        self._rpc = RpcChannel(address, token, self.cfg.rpc_timeout_s, self.cfg.hub_deadline_s)
        self.store = ReplicaStore()
        self._held: dict[str, tuple[str, int, Shard, str]] = {}
        self._manifests = ManifestCache()
        """Manifests this client was sent in fetch plans: a fetch says it has them, the hub omits them."""
        self._published: set[str] = set()
        """Live replicas this worker published (their re-registration after a hub restart says origin)."""
        self._data: DataServer | None = None
        self.worker_id: str | None = None
        self.location: Location | None = None
        self._endpoint: dict = {}
        self._hb_stop = threading.Event()
        self._hb: threading.Thread | None = None
        self._name, self._role, self._follow = "worker", "worker", False
        self._rejoin_lock = threading.Lock()
        self._joins = 0  # completed re-joins: a thread that saw NotJoined before the last one skips its own
        self.rejoined_at: float | None = None
        """When the last re-join (with its re-registrations) finished (time.monotonic())."""
        self._releasing: set[str] = set()
        """Replicas whose release is under way: a re-join does not re-register them (the release
        re-registers one itself if the new hub has not heard of it, so retention still decides)."""
        self._seeding: set[tuple] = set()
        self._pending_pub: dict[str, Future] = {}
        """Publishes in flight (`publish_async`), by replica id: release and leave wait for them."""
        self._pub_pool: ThreadPoolExecutor | None = None
        self._delta_snap: dict = {}  # (model, shard key) -> the publisher's copy of its last version (client_delta.py)
        self._delta_scratch: dict = {}  # (model, shard key) -> a reader's decode buffer, reused (client_delta.py)
        self._copies: dict = {}
        """(model, shard key) -> (version, manifest, data pointers) of the last private copy a fetch of a
        version already held made into other buffers: `fetch_delta` into them starts from it."""
        self._reader_key = ReaderKey()  # proves to sources that this client is its tickets' reader
        self._pull_fault: Callable | None = None  # fault injection on the data plane (set_pull_fault)

    @property
    def token(self) -> str:
        """The credential this client presents: what another process of the same worker (a TP engine's
        ranks) joins with. Read-only: a client's credential does not change."""
        return self._token

    # ------------------------------------------------------------------ seams for tests and tools
    def observe_rpc(self, fn: Callable[[str, dict, object], None]) -> Callable[[], None]:
        """Call `fn(op, args, result)` after each control call this client's channel made and the hub
        answered (not its heartbeats). Returns a function that stops it."""
        self._rpc.observers.append(fn)
        return lambda: self._rpc.observers.remove(fn)

    def set_pull_fault(self, fn: Callable | None) -> None:
        """Fault injection for tests: every data-plane pull of a fetch goes through
        `fn(sources, dest, pull)`, which may change the sources, call `pull(sources)` (the real pull:
        returns (failed replica ids, errors)) and return (failed, errors) of its own. None: off."""
        self._pull_fault = fn

    # ------------------------------------------------------------------ queries
    def latest(self, model: str) -> int | None:
        return self._call("latest", model=model)

    def wait_latest(self, model: str, at_least: int, timeout_s: float = 30.0) -> int | None:
        """`latest(model)` as soon as it is >= `at_least` (the hub parks the reply until that version
        commits), or after `timeout_s` whatever it is then (None: nothing of `model` committed yet).
        A timeout is not an error: compare and decide. One call instead of polling `latest`.

        Across a hub restart the call is sent again and the new hub parks it afresh; a hub that stays
        unreachable is HubUnavailableError after `config.hub_deadline_s`, never a hang."""
        args = check_args("wait_latest", {"model": model, "at_least": at_least, "timeout_s": timeout_s})
        # One try lasts the wait plus an ordinary reply time: a parked reply is not a dead hub.
        return self._call("wait_latest", attempt_s=args["timeout_s"] + self.cfg.rpc_timeout_s, **args)

    def versions(self, model: str) -> dict:
        """{"latest", "committed": every version number committed (ascending), "retained": those the
        retention policy keeps fetchable, "held": those some worker holds a full replica of now}."""
        return self._call("versions", model=model)

    def stats(self) -> dict:
        return self._call("stats")

    def held(self) -> list[str]:
        """Wire ids (`worker:model:version:shard:slot`) of the replicas this worker holds."""
        return sorted(self._held)

    def held_ids(self) -> list[ReplicaId]:
        """The replicas this worker holds, typed: read `.model`, `.version`, `.slot`; never parse `held()`."""
        return [ReplicaId(self.worker_id, model, version, shard.key, slot)
                for model, version, shard, slot in (self._held[rid] for rid in sorted(self._held))]
