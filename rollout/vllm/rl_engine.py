"""`rollout.engine=vllm`: the vLLM engine as the RL loop's rollout worker drives it.

    engine = build_engine("vllm", sampling, None, pad_token_id=2, eos_token_id=2, model_cfg=cfg.model)
    engine.attach_hub(hub, "policy")          # the worker's joined HubClient
    engine.apply_staged()                     # between calls: a prefetched newer version (the only pause)
    engine.update_latest()                    # when the staleness bound needs a newer version now
    engine.prefetch_latest()                  # before generating: fetch what is newer in the background
    out = engine.generate(prompt_ids)         # a Rollout tagged with out.version

Unlike the `hf` engine the hub cannot fetch into vLLM's parameters (the CPU backend repacks them),
so weights go through the `HubWeightStage` (docs/vllm.md); `named_parameters_for_sync` refuses.
`sync_caps` (an `EngineCaps`) says so to the weight-sync routes (rlsync/sync/).
At `tensor_parallel_size` k > 1 (`pools.<name>.engine.tensor_parallel_size`) there is no staging: each
vLLM TP rank joins the hub and `update_latest` makes every rank read only its slices of the version
and apply them in place (`VllmEngine.load_version`, rollout/vllm/tp.py); no prefetch, so the read is
inside the pause (`apply_staged` / `prefetch_latest` do nothing).
The engine loads its own copy of the model (`model_dir`, default SmolLM2 prepared by
`rollout.vllm.model_dir`); the loader's model, if any, is not used. Each update returns a
`SyncStats` (fetch_s, apply_s, pause_s) the worker records as an `engine_update` event.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..engine import EngineCaps
from ..registry import register_engine
from .engine import VllmEngine
from .stage import HubWeightStage, SyncStats

log = logging.getLogger(__name__)


class HubFedVllmEngine:
    def __init__(self, engine: VllmEngine):
        self.engine = engine
        self.stage: HubWeightStage | None = None
        self._tp: tuple | None = None
        """k > 1: (hub client, model, layout) the TP ranks read from."""

    @property
    def version(self) -> int:
        return self.engine.version

    @version.setter
    def version(self, v: int) -> None:
        self.engine.set_version(v)

    @property
    def sync_caps(self) -> EngineCaps:
        """Weights arrive through `attach_hub` / `update_latest` (staged at k = 1, TP-sliced at k > 1), never
        `fetch(into=...)`; `load_state` (the direct apply) only at k = 1 (it sends callables to one worker)."""
        one = self.engine.config.tensor_parallel_size == 1
        return EngineCaps(load_state=one, staged=one, tp_sliced=not one)

    def load_state(self, tensors, version: int | None = None) -> None:
        """Apply a whole version from a name -> tensor mapping (the same direct apply the hub's stage uses;
        the names are checked, a partial update is refused)."""
        specs = tuple((n, tuple(t.shape)) for n, t in tensors.items())
        self.engine.apply(iter(tensors.items()), self.engine.version if version is None else version,
                          expect=list(tensors), specs=specs)  # tags the engine with the version

    def attach_hub(self, hub, model: str, follow_s: float = 0.05, layout=None) -> None:
        """Take weights from `hub` (joined); prefetch each new version as it commits. `layout`: the
        trainer publishes ZeRO-3 partitions in this `ShardedLayout` (read whole, docs/resharding.md)."""
        if self.engine.config.tensor_parallel_size > 1:
            self.engine.join_hub(hub.address, hub.token, hub.location.host, f"{hub.worker_id}-vllm")
            self._tp = (hub, model, layout)
            return
        self.stage = HubWeightStage(hub, self.engine, model, layout=layout)
        self.stage.follow(follow_s)

    def generate(self, prompts):
        return self.engine.generate(prompts)

    def named_parameters_for_sync(self):
        raise TypeError("the vllm engine takes weights through attach_hub/update_latest (vLLM repacks its "
                        "parameters: the hub cannot fetch into them)")

    def apply_staged(self) -> SyncStats | None:
        """Apply a prefetched newer version, if one is complete in staging."""
        return None if self._tp else self.stage.apply_staged()

    def prefetch_latest(self) -> bool:
        """Start fetching the hub's latest into staging when it is newer than what the engine holds."""
        return False if self._tp else self.stage.poll()

    def update_latest(self) -> SyncStats:
        """The newest version now: wait for a prefetch in flight and apply it if it is the latest,
        else fetch and apply `latest`. The engine has no admissible version meanwhile (the staleness
        bound asked for this one), so waiting for the fetch is `fetch_wait_s`; `pause_s` is the apply
        (with its lock wait and checks), as for a prefetched update."""
        if self._tp:
            return self._load_latest()
        t0 = time.monotonic()
        staged = self.stage.wait_staged()
        waited = time.monotonic() - t0
        latest = self.stage.hub.latest(self.stage.model)
        got = None
        if staged is not None and latest is not None and staged >= latest:
            got = self.stage.apply_staged()
        if got is None:
            got = self.stage.update("latest")
        got.fetch_wait_s += waited
        return got

    def _load_latest(self) -> SyncStats:
        """k > 1: every TP rank reads its slices of the hub's latest and applies them (one call)."""
        hub, model, layout = self._tp
        latest = hub.latest(model)
        if latest is None:
            raise LookupError(f"the hub has no committed version of {model!r}")
        if latest <= self.engine.version:
            return SyncStats(version=self.engine.version, fetch_s=0.0, apply_s=0.0, pause_s=0.0, nbytes=0)
        t0 = time.monotonic()
        ranks = self.engine.load_version(model, latest, layout)
        sources: dict[str, int] = {}
        for r in ranks:
            for w, n in r["bytes_by_source"].items():
                sources[w] = sources.get(w, 0) + n
        return SyncStats(version=latest, fetch_s=max(r["read_s"] for r in ranks) * len(ranks),
                         apply_s=max(r["apply_s"] for r in ranks), pause_s=time.monotonic() - t0,
                         nbytes=sum(r["nbytes"] for r in ranks), bytes_by_source=sources)

    def close(self) -> None:
        if self._tp:
            self.engine.llm.collective_rpc("rlsync_leave")
        if self.stage is not None:
            self.stage.close()


@register_engine("vllm")
def build_vllm_engine(sampling: Any, model: Any, *, pad_token_id: int, eos_token_id: int,
                      model_cfg: Any = None) -> HubFedVllmEngine:
    """A vLLM engine with the pool's sampling config (`RolloutEngine.Config` fields)."""
    kind = getattr(model_cfg, "kind", "smollm2")
    if kind != "smollm2":
        raise ValueError(f"rollout.engine=vllm serves a real model from a directory: model.kind=smollm2 "
                         f"(got {kind!r}; tiny random-init models use rollout.engine=hf)")
    cfg = VllmEngine.Config(temperature=sampling.temperature, top_p=sampling.top_p,
                            top_k=sampling.top_k, max_new_tokens=sampling.max_new_tokens,
                            do_sample=sampling.do_sample,
                            tensor_parallel_size=getattr(sampling, "tensor_parallel_size", 1))
    return HubFedVllmEngine(VllmEngine(cfg, eos_token_id=eos_token_id, pad_token_id=pad_token_id))
