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
In flight (`start_inflight`, EngineCaps.inflight; the receiver's `sync.inflight=true`): each version the
stage fetches is built beside the live kernels in the fetch's thread (`VllmEngine.prepare`) and switched in
at the next decode-step boundary; `take_switches` hands those switches to the receiver (docs/vllm.md).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any

from rlsync.hub import Manifest

from ..engine import EngineCaps
from ..registry import register_engine
from .engine import Switch, VllmEngine
from .stage import HubWeightStage
from .sync_stats import SyncStats
from .staging import WeightIntegrityError, specs_of

log = logging.getLogger(__name__)


class HubFedVllmEngine:
    def __init__(self, engine: VllmEngine):
        self.engine = engine
        self.stage: HubWeightStage | None = None
        self._tp: tuple | None = None
        """k > 1: (hub client, model, layout) the TP ranks read from."""
        self._inflight = False
        self._fetched: dict[int, tuple] = {}
        """In-flight: version -> (fetch_s, bytes, bytes by source, transports) of its fetch, until switched in."""
        self._expect_fn = None
        self._expected: dict[int, tuple] = {}
        """verify_ahead: version -> (manifest, what the engine must hold: the verifier's digests), made as it landed."""

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
        return EngineCaps(load_state=one, staged=one, tp_sliced=not one, inflight=one, verify=one,
                          layout_variant=self.engine.start_variant)

    def load_state(self, tensors, version: int | None = None) -> None:
        """Apply a whole version from a name -> tensor mapping (the same direct apply the hub's stage uses;
        the names are checked, a partial update is refused)."""
        specs = tuple((n, tuple(t.shape)) for n, t in tensors.items())
        self.engine.apply(iter(tensors.items()), self.engine.version if version is None else version,
                          expect=list(tensors), specs=specs)  # tags the engine with the version

    def attach_hub(self, hub, model: str, follow_s: float = 0.05, layout=None, variant: str | None = None) -> None:
        """Take weights from `hub` (joined); prefetch each new version as it commits. `layout`: the
        trainer publishes ZeRO-3 partitions in this `ShardedLayout` (read whole, docs/resharding.md).
        `variant`: read this derived variant of each version (docs/derived.md)."""
        if variant is not None and self.engine.config.tensor_parallel_size > 1:
            raise ValueError("sync.variant with a TP vLLM engine is not supported (its ranks read TP slices)")
        if self.engine.config.tensor_parallel_size > 1:
            self.engine.join_hub(hub.address, hub.token, hub.location.host, f"{hub.worker_id}-vllm")
            self._tp = (hub, model, layout)
            return
        self.stage = HubWeightStage(hub, self.engine, model, HubWeightStage.Config(variant=variant), layout=layout)
        self.stage.follow(follow_s)

    def generate(self, prompts):
        return self.engine.generate(prompts)

    def named_parameters_for_sync(self):
        raise TypeError("the vllm engine takes weights through attach_hub/update_latest (vLLM repacks its "
                        "parameters: the hub cannot fetch into them)")

    def apply_staged(self) -> SyncStats | None:
        """Apply a prefetched newer version, if one is complete in staging (in-flight: switch a prepared one
        in; a version the engine could not build beside its weights is applied drained)."""
        if self._tp:
            return None
        return (self.switch_prepared() if self._inflight else None) or self.stage.apply_staged()

    # ------------------------------------------------------------------ in-flight (EngineCaps.inflight)
    def start_inflight(self, kv_policy: str = "keep") -> None:
        """From now on every version fetched into staging is built beside the live weights in the fetch's
        thread and switched in at the next decode-step boundary (rollout/vllm/decode.py). The receiver
        follows the hub (`stage_version` as each version commits), so the stage's own polling stops."""
        if kv_policy not in ("keep", "recompute"):
            raise ValueError(f"kv policy must be 'keep' or 'recompute' (got {kv_policy!r})")
        self.engine.config.kv_policy = kv_policy
        self.stage.close()  # its poll follower; the stage itself keeps working
        self.stage.on_landed = self._build
        self._inflight = True

    def _build(self, version: int) -> None:
        st = self.stage
        names, specs, stream = st._staged_stream()
        try:
            ok = self.engine.prepare(stream, version, specs=specs, expect=names)
        except WeightIntegrityError:
            st._drop_staged(version)
            raise
        if ok:
            self._fetched[version] = (st._staged_fetch_s, st._manifest.nbytes, dict(st._staged_sources),
                                      dict(st._staged_transports))
        else:
            log.warning("%s v%d cannot be built beside the live weights (no direct plan): applied drained",
                        st.model, version)

    def stage_version(self, version: int) -> int | None:
        """Fetch `version` into staging and build it beside the live weights; returns once done (the
        version staged, or None when a newer fetch is still running). The receiver's follower calls this."""
        self.stage.prefetch(version)
        return self.stage.wait_staged()

    def _stats(self, sw: Switch) -> SyncStats:
        fetch_s, nbytes, sources, transports = self._fetched.pop(sw.version, (0.0, 0, {}, {}))
        for v in [v for v in self._fetched if v < sw.version]:
            del self._fetched[v]  # built, then overtaken by a newer build before its switch
        return SyncStats(version=sw.version, fetch_s=fetch_s, apply_s=sw.build_s, pause_s=sw.pause_s,
                         nbytes=nbytes, bytes_by_source=sources, transports=transports, in_flight=sw.in_flight)

    def switch_prepared(self) -> SyncStats | None:
        """Between calls: switch a prepared newer version in now (the pause is the swap)."""
        sw = self.engine.switch_prepared()
        return None if sw is None else self._stats(self.engine.switches.pop())

    def take_switches(self) -> list[SyncStats]:
        """The switches made inside `generate` since the last call (each recorded once)."""
        out, self.engine.switches[:] = list(self.engine.switches), []
        return [self._stats(sw) for sw in out]

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
        got = self.switch_prepared() if self._inflight else None
        if got is not None and latest is not None and got.version >= latest:
            got.fetch_wait_s += waited
            return got
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

    # ------------------------------------------------------------------ verification (EngineCaps.verify)
    def weights_readback(self) -> dict:
        """The direct apply's own buffers, by checkpoint name ({}: in flight, or a layerwise apply: the
        probe alone checks those; docs/verify.md)."""
        m = self.stage._manifest if self.stage is not None else None
        if self._inflight or not isinstance(m, Manifest):
            return {}
        return self.engine.readback(specs_of(m))

    @property
    def compute_dtype(self):
        import torch

        return getattr(torch, self.engine.config.dtype)

    def probe_logprobs(self, tokens: list[int]) -> list[float]:
        return self.engine.probe_logprobs(tokens)

    def verify_ahead(self, expect) -> None:
        """From now on each version prefetched into staging gets `expect(manifest, staging, recheck)` (the
        verifier's digests of what the engine must hold after applying it) in the fetch's thread, while the
        engine generates; `verify_source` hands them out, so the check after the apply needs no staging and
        can run while the engine generates its next batch (docs/verify.md, "Overlap"). A layer packed straight
        from fused staging (a variant in the engine's dtype) is read back from that staging: the stage then holds
        off its next prefetch until the check says `readback_done`."""
        if self._inflight or self.stage is None:
            raise ValueError("verify_ahead needs a staged engine that does not switch in flight")
        self._expect_fn = expect
        self.stage.on_landed = self._expect_landed
        self.stage.hold_applied = True

    def _expect_landed(self, version: int) -> None:
        m = self.stage._manifest
        if not isinstance(m, Manifest):  # a sharded read: no one manifest, checked in the pause
            return
        expected = self._expect_fn(m, self.stage._staging, not self.stage.config.verify)
        self._expected = {v: e for v, e in self._expected.items() if v >= self.engine.version}
        self._expected[version] = (m, expected)

    def verify_source(self) -> tuple:
        """(manifest, expected) of the version last applied: with `verify_ahead`, the digests made as it landed
        (no staging needed); else the staging itself, or (None, None) when the staging holds something else
        (a prefetch of a newer version began: the apply's own unit re-check covered it) or a sharded read
        (no one manifest). Call it inside `staging_held()`."""
        ahead = self._expected.get(self.engine.version)
        if ahead is not None:
            return ahead
        st, m = self.stage, self.stage._manifest
        moved = (st._fetch is not None and st._fetch.is_alive()) or st.staged_version != self.engine.version
        return (m, st._staging) if isinstance(m, Manifest) and not moved else (None, None)

    def readback_done(self, version: int) -> None:
        """A check has finished reading `version` back: the stage may refill its staging."""
        if self.stage is not None:
            self.stage.release_applied(version)

    @contextmanager
    def staging_held(self):
        """No prefetch refills the staging while the verifier compares the engine with it (the stage's lock)."""
        with self.stage._lock:
            yield

    def reapply(self, version: int) -> None:
        """Withdraw this engine's staging replica (it may be the corrupt copy) and fetch + apply `version` again."""
        self.stage._drop_staged(version)
        self._expected.pop(version, None)  # made from the copy being withdrawn: the re-check uses the new staging
        self.engine.set_version(-1)
        self.stage.update(version)

    def close(self) -> None:
        if self._tp:
            self.engine.llm.collective_rpc("rlsync_leave")
        if self.stage is not None:
            self.stage.close()


@register_engine("vllm")
def build_vllm_engine(sampling: Any, model: Any, *, pad_token_id: int, eos_token_id: int,
                      model_cfg: Any = None, variant: str | None = None) -> HubFedVllmEngine:
    """A vLLM engine with the pool's sampling config (`RolloutEngine.Config` fields). `variant`: start in that
    derived variant's layout (`int8`: from the W8A8 checkpoint of the model directory, made once and cached by
    `prepare_variant`; the run's versions then arrive as `policy@int8`, applied in place)."""
    from .model_dir import prepare_smollm2, prepare_variant

    kind = getattr(model_cfg, "kind", "smollm2")
    if kind != "smollm2":
        raise ValueError(f"rollout.engine=vllm serves a real model from a directory: model.kind=smollm2 "
                         f"(got {kind!r}; tiny random-init models use rollout.engine=hf)")
    model_dir = prepare_variant(prepare_smollm2(), variant) if variant is not None else None
    cfg = VllmEngine.Config(model_dir=model_dir, temperature=sampling.temperature, top_p=sampling.top_p,
                            top_k=sampling.top_k, max_new_tokens=sampling.max_new_tokens,
                            do_sample=sampling.do_sample,
                            tensor_parallel_size=getattr(sampling, "tensor_parallel_size", 1))
    return HubFedVllmEngine(VllmEngine(cfg, eos_token_id=eos_token_id, pad_token_id=pad_token_id))
