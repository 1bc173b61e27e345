"""rlsync as a vLLM weight-transfer backend: `backend="rlsync"` in vLLM's own RL weight-sync flow.

Inference side (in every vLLM worker process, before the engine starts):

    from rlsync.rollout.vllm.transfer_backend import register
    register()                                    # WeightTransferEngineFactory + ...TrainerFactory
    llm = LLM(model=..., weight_transfer_config=WeightTransferConfig(backend="rlsync"))

Trainer side (vLLM's trainer API; `client` is any VLLMWeightSyncClient, e.g. RayVLLMWeightSyncClient):

    info = RlsyncTrainerInitInfo(rank=0, hub_address=hub.address, hub_token=hub.token)
    sender = WeightTransferTrainerFactory.trainer_init(info, client=client, source=ModuleSource(model))
    ... optimizer.step() ...
    sender.send_weights()                         # publishes version v+1 through the hub, engines pull it

What happens: `send_weights` publishes the source's live tensors as the next version (a
`HubClient.publish`, no copy) and drives start/update/finish on the engines with only
`{"version": v}` in the update info. Each engine's worker fetches v from the hub's best replica
(topology-aware: the trainer or any engine already holding v, relays pipelined), into its host
staging buffers, checks every unit against the manifest, and applies it (the direct apply of
rollout/vllm/direct.py; vLLM's layerwise reload for a model it cannot place). When all engines
are done, the trainer releases v: its buffers are free for the next optimizer step, and v stays
retrievable from the engines (no copy on the trainer when an engine holds it; the hub's retention protocol offload-seeds only when nobody else does). An engine
started later (elastic) runs `init_weight_transfer_engine` and one update of the current version:
it reads from a peer engine's staging replica.

Simplifies: tensor parallel 1 (one worker per engine); every trainer rank must be the sender
(rank 0) or publish nothing (a sharded trainer publishes shards through `HubClient` directly).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from .worker_apply import layerwise_load, quiet_dtype_notes
from .direct import direct_load, plan_direct
from .staging import checked_tensors, specs_of

log = logging.getLogger(__name__)
BACKEND = "rlsync"


def register() -> None:
    """Register the `rlsync` backend with vLLM's worker and trainer factories (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, RlsyncWeightTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, RlsyncTrainerWeightTransferEngine)


@dataclass
class RlsyncInitInfo(WeightTransferInitInfo):
    """What an engine's worker needs to join the hub (sent by the trainer at the init handshake)."""

    hub_address: str
    hub_token: str
    model: str = "policy"
    dc: str = "dc0"
    host: str = ""
    """The worker's host for topology-aware source selection ('' = this machine's hostname)."""
    name: str = "vllm"
    serve_peers: bool = True
    """Keep the staging buffers as a hub replica other engines read from."""


@dataclass
class RlsyncUpdateInfo(WeightTransferUpdateInfo):
    version: int | str = "latest"
    """The version to fetch and apply."""


class RlsyncWeightTransferEngine(WeightTransferEngine[RlsyncInitInfo, RlsyncUpdateInfo]):
    """Worker side: a hub replica with host staging buffers; each update fetches and applies one version."""

    init_info_cls = RlsyncInitInfo
    update_info_cls = RlsyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        quiet_dtype_notes()
        self.hub = None
        self.info: RlsyncInitInfo | None = None
        self.staging: dict[str, torch.Tensor] | None = None
        self.version: int | None = None
        self.last: dict[str, Any] = {}
        """Figures of the last update: version, fetch_s, apply_s, bytes_by_source."""

    def init_transfer_engine(self, init_info: RlsyncInitInfo) -> None:
        import socket

        from rlsync.hub import HubClient, Location

        if self.hub is not None:
            return  # one membership per worker; a second trainer handshake reuses it
        self.info = init_info
        self.hub = HubClient(init_info.hub_address, token=init_info.hub_token)
        self.hub.join(Location(dc=init_info.dc, host=init_info.host or socket.gethostname()), name=init_info.name)
        log.info("vLLM worker joined the rlsync hub at %s as %s", init_info.hub_address, self.hub.worker_id)

    def start_weight_update(self) -> None:
        """Nothing yet: the layerwise reload starts only once the version's bytes are here, so a
        failed fetch leaves the model's weights untouched."""

    def finish_weight_update(self) -> None:
        """Nothing left: `receive_weights` applied the whole version."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def receive_weights(self, update_info: RlsyncUpdateInfo) -> None:
        if self.hub is None:
            raise RuntimeError("init_weight_transfer_engine must run before update_weights")
        model = self.info.model
        t0 = time.monotonic()
        res = self.hub.fetch(model, update_info.version, into=self.staging)
        self.staging = res.tensors
        t1 = time.monotonic()
        checked = checked_tensors(res.tensors, res.manifest, what=f"{model} v{res.version}")
        plans = self.__dict__.setdefault("_plans", {})   # the direct apply's layout, once per version layout
        specs = specs_of(res.manifest)
        if specs not in plans:
            plans[specs] = plan_direct(self.model, list(specs))
        if plans[specs] is not None:
            loaded = direct_load(self.model, plans[specs], checked)
        else:
            loaded = layerwise_load(self.model, self.model_config, checked)
        missing = {s.name for s in res.manifest.tensors} - loaded
        if missing:
            raise RuntimeError(f"{model} v{res.version}: vLLM did not load {sorted(missing)[:5]}")
        self.version = res.version
        self.last = {"version": res.version, "fetch_s": t1 - t0, "apply_s": time.monotonic() - t1,
                     "bytes_by_source": dict(res.bytes_by_source)}
        if not self.info.serve_peers:
            self.hub.release(model, res.version)
        log.info("applied %s v%d: fetch %.3fs, apply %.3fs", model, res.version, self.last["fetch_s"],
                 self.last["apply_s"])

    def shutdown(self) -> None:
        hub, self.hub = self.hub, None
        if hub is not None:
            hub.leave()


def worker_sync_state(worker) -> dict[str, Any]:
    """collective_rpc helper: the rlsync engine's hub worker id, version and last update's figures."""
    eng = worker.weight_transfer_engine
    return {"worker_id": eng.hub.worker_id if eng.hub else None, "version": eng.version, **eng.last}


@dataclass
class RlsyncTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    hub_address: str = ""
    hub_token: str = ""
    model: str = "policy"
    dc: str = "dc0"
    host: str = ""
    first_version: int = 1
    """Version number of the first `send_weights` (then +1 each call)."""
    serve_peers: bool = True
    """Sent to the engines: keep their staging buffers as replicas other engines read from."""


class RlsyncTrainerWeightTransferEngine(TrainerWeightTransferEngine[RlsyncTrainerInitInfo]):
    """Trainer side: publishes the source's live tensors through `HubClient`, then drives the
    engines' update with the version number only."""

    init_info_cls = RlsyncTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info: RlsyncTrainerInitInfo, *, client, source=None):
        import socket

        from rlsync.hub import HubClient, Location

        if source is None:
            raise ValueError("the rlsync trainer engine publishes a WeightSource: pass source=ModuleSource(model)")
        eng = cls(client=client, source=source, is_sender=init_info.is_sender)
        eng.info, eng.next_version = init_info, init_info.first_version
        eng.hub = None
        if eng.is_sender:
            eng.hub = HubClient(init_info.hub_address, token=init_info.hub_token)
            eng.hub.join(Location(dc=init_info.dc, host=init_info.host or socket.gethostname()), name="trainer")
            client.init_weight_transfer_engine(eng.engine_init_info())
        return eng

    def engine_init_info(self) -> dict[str, Any]:
        """What `init_weight_transfer_engine` sends to engines (also for engines that join later)."""
        i = self.info
        return {"hub_address": i.hub_address, "hub_token": i.hub_token, "model": i.model, "dc": i.dc,
                "serve_peers": i.serve_peers}

    def send_weights(self) -> int:
        """Publish the source as the next version and have the engines pull and apply it; returns it."""
        tensors = {name: t.detach() for name, t in self.source}   # live tensors, no copy
        v = self.next_version
        if not self.is_sender:
            return v
        self.hub.publish(self.info.model, v, tensors)
        try:
            self.client.start_weight_update()
            self.client.update_weights({"version": v})
            self.client.finish_weight_update(weight_version=str(v))
        finally:
            # The engines hold v now: the trainer's buffers are free for the next optimizer step
            # (if none does, retention keeps v by offload-seeding before this returns).
            self.hub.release(self.info.model, v)
        self.next_version = v + 1
        return v

    def shutdown(self) -> None:
        hub, self.hub = self.hub, None
        if hub is not None:
            hub.leave()
