"""What the engine computes with, checked after every apply (issue 35 item 1; docs/verify.md).

The hub checks every unit on the wire and in staging; this checks what is in the engine's own buffers
afterwards, for every route behind the receiver seam (an engine declaring `EngineCaps.verify`):

    v = EngineVerifier(cfg.sync.verify, hub, "policy", engine, clock)
    v.check(version, manifest, staged=None)   # WeightsVerifyError, or the seconds it took

- **weights** (every apply): the engine's read-back (`engine.weights_readback()`: name -> the tensor its
  forward reads, after any conversion). Same dtype as the manifest: every unit's xxh3 checksum recomputed
  over the read-back. Converted (fp32 -> bf16): the receiver re-checks the staged bytes against the
  manifest, converts them itself and compares per-tensor xxh3 digests with the read-back.
- **probe** (every `probe_every`-th version): the engine's log-probs of a fixed token sequence
  (`engine.probe_logprobs(tokens)`) against the trainer's, which it publishes as the version's hub
  annotation `rlsync.probe` (`publish_probe`), within `TOLERANCE[engine dtype]`. It catches what no
  read-back can see: a kernel's private packed copy left stale (vLLM's tied head on CPU, docs/vllm.md).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

log = logging.getLogger(__name__)

PROBE_KEY = "rlsync.probe"
"""The hub annotation (hub/state/annotations.py) holding the trainer's probe of a version."""
TOLERANCE = {"float64": 1e-6, "float32": 1e-3, "float16": 0.2, "bfloat16": 0.5}
"""Largest mean |engine - trainer| log-prob per probe token, by the engine's compute dtype. The probe's tokens
are random (unlikely) ones, where rounding weighs more than on text: fp32, the same weights and function,
~1e-6 here; vLLM bf16 on the right version 0.151 (tests/vllm/test_vllm_engine.py), a stale tied head far
above (docs/verify.md). float16 is not measured here: set between the two by its mantissa."""


@dataclass(kw_only=True)
class VerifyConfig:
    weights: bool = True
    """Read the engine's buffers back after every apply and compare with the version's manifest."""
    probe_every: int = field(default=0, metadata={"ge": 0})
    """Every n-th version (version % n == 0) the trainer publishes its log-probs of fixed tokens and each
    engine compares its own; 0: off."""
    probe_tokens: int = field(default=16, metadata={"ge": 2})
    """Length of the fixed probe sequence."""
    overlap: bool = True
    """Run the weights check while the engine generates its next batch (the batch's samples wait for it and are
    dropped if it fails) instead of inside the update's pause. The probe always runs before generating."""
    reapply_attempts: int = field(default=2, metadata={"ge": 1})
    """After a failed check: fetch the version again (from another replica) and re-check, this many times."""


class WeightsVerifyError(RuntimeError):
    """The engine does not compute with the version it reports: `check` (weights | probe), `version`, `detail`."""

    def __init__(self, check: str, version: int, detail: str):
        super().__init__(f"v{version}: {check} check failed: {detail}")
        self.check, self.version, self.detail = check, version, detail


def _native():
    try:
        from rlsync._engine import xxh3_64  # GIL-free, SIMD; the digest xxhash gives
    except ImportError:
        return None
    return xxh3_64


_POOL = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="rlsync-verify")


def _digest(t: torch.Tensor) -> int:
    t = t.detach().contiguous()
    native = _native()
    if native is not None:
        return native([(t.data_ptr(), t.numel() * t.element_size())])
    return xxhash.xxh3_64(t.view(-1).view(torch.uint8).numpy()).intdigest()


def bad_units(manifest: Any, tensors: dict[str, torch.Tensor]) -> list[int]:
    """`manifest.verify(tensors)`, hashed by the native engine on a few threads (GIL released) when it is built."""
    native = _native()
    if native is None:
        return manifest.verify(tensors)
    addr = [tensors[t.name].data_ptr() for t in manifest.tensors]
    units = manifest.units

    def check(u: int) -> bool:
        return native([(addr[ti] + off, ln) for ti, off, ln in units[u].segments]) != units[u].checksum

    return [u for u, bad in zip(range(len(units)), _POOL.map(check, range(len(units)))) if bad]


class ConvertedDigests(dict):
    """name -> xxh3 of a version's tensor as a converting engine must hold it (e.g. fp32 -> bf16), computed
    once where the version lands (`expected_digests`), so the check after the apply reads the engine's
    buffers alone and needs no staging kept (docs/verify.md, "Overlap"). Empty: the manifest is already in
    the engine's dtype (a `bf16` variant), its unit checksums are the expectation."""


def expected_digests(manifest: Any, staged: dict[str, torch.Tensor], dtype: Any, recheck: bool = False
                     ) -> ConvertedDigests:
    """What each tensor of `manifest` hashes to in a `dtype` engine, from the staged bytes. Sound when every
    byte the engine then applies is re-checked against the manifest (the vLLM stage's apply does, unit by
    unit): a byte changed after this pass fails that re-check, so the digests describe the version itself.
    `recheck`: the apply checks nothing (`verify=False` stage), re-check the staging here first. `dtype` None:
    the engine holds the manifest's own dtypes (a variant such as `int8`)."""
    if dtype is None:
        return ConvertedDigests()
    dtype = str(dtype).removeprefix("torch.")
    if all(t.dtype == dtype for t in manifest.tensors):
        return ConvertedDigests()
    if recheck and bad_units(manifest, staged):
        raise WeightsVerifyError("weights", -1, "the staging does not match the manifest it landed with")
    to = getattr(torch, dtype)
    names = [t.name for t in manifest.tensors]
    return ConvertedDigests(zip(names, _POOL.map(lambda n: _digest(staged[n].to(to)), names)))


def check_weights(manifest: Any, readback: dict[str, torch.Tensor],
                  staged: dict[str, torch.Tensor] | ConvertedDigests | None) -> list[str] | None:
    """Names of the tensors whose bytes in the engine differ from what `manifest` implies ([]: all agree;
    None: `manifest` does not describe the engine's tensors, nothing to compare). A converting engine is
    compared with `staged`: the staged tensors (re-checked, then converted here) or their `ConvertedDigests`."""
    want = {t.name: t for t in manifest.tensors}
    if any(n not in readback or tuple(readback[n].shape) != tuple(t.shape) for n, t in want.items()):
        return None  # another layout (a ZeRO-3 shard, a delta object): the route's own checks cover it
    same = all(str(readback[n].dtype).removeprefix("torch.") == t.dtype for n, t in want.items())
    if same:
        bad = bad_units(manifest, {n: readback[n].contiguous() for n in want})
        return sorted({manifest.tensors[ti].name for u in bad for ti, _, _ in manifest.units[u].segments})
    if isinstance(staged, ConvertedDigests) and staged:
        return [n for n, d in zip(want, _POOL.map(lambda n: _digest(readback[n]), want)) if d != staged.get(n)]
    if staged is None or isinstance(staged, ConvertedDigests):
        raise ValueError("a converting engine's read-back needs the staged tensors (or their digests) to compare with")
    bad_staged = bad_units(manifest, staged)  # the source of the expected digests must itself be the version
    if bad_staged:
        return sorted({"staging:" + manifest.tensors[ti].name for u in bad_staged
                       for ti, _, _ in manifest.units[u].segments})
    def differs(n: str) -> bool:
        return _digest(staged[n].to(readback[n].dtype)) != _digest(readback[n])

    return [n for n, bad in zip(want, _POOL.map(differs, want)) if bad]


def probe_token_ids(vocab_size: int, n: int) -> list[int]:
    """The fixed probe sequence: the same for every version and process."""
    g = torch.Generator().manual_seed(35)
    return torch.randint(0, vocab_size, (n,), generator=g).tolist()


@torch.no_grad()
def probe_logprobs(module: torch.nn.Module, tokens: list[int]) -> list[float]:
    """log p(tokens[t] | tokens[:t]) for t >= 1 under an HF causal LM (temperature 1), the trainer's way."""
    from rlsync.core.logprobs import token_logprobs

    ids = torch.tensor([tokens])
    lp, _ = token_logprobs(module, ids, torch.ones_like(ids), temperature=1.0)
    return lp[0, 1:].tolist()


def publish_probe(hub: Any, model: str, version: int, module: torch.nn.Module, n: int) -> dict:
    """The trainer's probe of `version` as the version's hub annotation (after it commits)."""
    inner = getattr(module, "module", module)  # DDP / DeepSpeed wrap the HF model
    tokens = probe_token_ids(inner.config.vocab_size, n)
    was = inner.training
    inner.eval()
    try:
        probe = {"tokens": tokens, "logprobs": probe_logprobs(inner, tokens)}
    finally:
        inner.train(was)
    hub.annotate(model, version, PROBE_KEY, probe)
    return probe


class EngineVerifier:
    """The receiver's checker of one engine.

    `failed`: versions that failed a check after the engine had generated with them (an in-flight switch, or
    an overlapped weights check); the worker reports them and the driver drops those samples. A failure found
    before any generation is healed (or raised) before the engine generates: nothing to drop."""

    def __init__(self, cfg: VerifyConfig, hub: Any, model: str, engine: Any, clock: Any):
        self.cfg, self.hub, self.model, self.engine, self.clock = cfg, hub, model, engine, clock
        self.failed: set[int] = set()
        self.seconds = 0.0
        """Time spent checking, all applies (the bench's overhead)."""
        self.checks = {"weights": 0, "probe": 0}
        self._pending: tuple | None = None  # an overlapped weights check: (version, manifest, staged, reapply, thread, box)
        self._probe_later: tuple | None = None  # (version, reapply): its probe was not annotated yet at the apply
        self._read_done = getattr(engine, "readback_done", None)
        """An engine whose read-back may be a staging it refills later (vLLM's, a variant packed from staging)
        holds that refill until each weights check has read it: told here, whatever the check's outcome."""

    def probe_due(self, version: int) -> bool:
        return self.cfg.probe_every > 0 and version % self.cfg.probe_every == 0

    def check(self, version: int, manifest: Any, staged: dict | None = None, probe: bool = True) -> float:
        """Run the checks due for `version` on what the engine now holds; the seconds they took."""
        t0, before = time.perf_counter(), dict(self.checks)
        try:
            if self.cfg.weights and manifest is not None:
                self._weights(version, manifest, staged)
            if probe and self.probe_due(version):
                self._probe(version)
        finally:
            took = time.perf_counter() - t0
            self.seconds += took
        ran = [k for k, n in self.checks.items() if n > before[k]]  # what had something to compare
        self.clock.event("verify", version=version, seconds=took, ok=True, checks=",".join(ran))
        return took

    def _weights(self, version: int, manifest: Any, staged: dict | None, readback: dict | None = None) -> None:
        try:
            bad = check_weights(manifest, self.engine.weights_readback() if readback is None else readback, staged)
        finally:
            self._released(version)
        self.checks["weights"] += bad is not None
        if bad:
            raise WeightsVerifyError("weights", version, f"{len(bad)} tensors differ from the manifest "
                                                         f"({', '.join(bad[:4])})")

    def _probe(self, version: int) -> None:
        probe = self.hub.annotations(self.model, version).get(PROBE_KEY)
        if probe is None:  # a trainer that publishes no probe (probe_every off there, ZeRO-3): nothing to compare
            log.debug("%s v%d has no probe annotation: probe check skipped", self.model, version)
            return
        mine = self.engine.probe_logprobs(list(probe["tokens"]))
        dtype = str(self.engine.compute_dtype).removeprefix("torch.")
        tol = TOLERANCE.get(dtype, TOLERANCE["bfloat16"])
        gap = sum(abs(a - b) for a, b in zip(mine, probe["logprobs"])) / max(1, len(mine))
        self.checks["probe"] += 1
        if not gap <= tol:  # NaN fails too
            raise WeightsVerifyError("probe", version, f"mean |log-prob gap| {gap:.4f} over {len(mine)} tokens > "
                                                       f"{tol} ({dtype})")

    def heal(self, version: int, manifest: Any, reapply: Any, staged: dict | None = None, *, used: bool = False,
             first: WeightsVerifyError | None = None) -> None:
        """Check `version`; on a failure quarantine the engine (version -1: the worker generates nothing with it;
        `used`: it already did, so `version` goes to `failed`), record a `verify_failed` event, take the version
        again with `reapply(version)` -> (manifest, staged) (the receiver's fetch from another replica) and check
        again; WeightsVerifyError after `reapply_attempts`. `first`: a failure already found (overlapped check)."""
        for attempt in range(self.cfg.reapply_attempts + 1):
            try:
                if first is not None:
                    err, first = first, None
                    raise err
                self.check(version, manifest, staged)
            except WeightsVerifyError as e:
                if used:
                    self.failed.add(version)
                self.engine.version = -1
                self.clock.event("verify_failed", version=version, check=e.check, detail=e.detail[:200],
                                 attempt=attempt)
                log.warning("engine quarantined: %s (attempt %d of %d)", e, attempt + 1, self.cfg.reapply_attempts + 1)
                if attempt == self.cfg.reapply_attempts:
                    raise
                manifest, staged = reapply(version)
                continue
            self.engine.version = version
            if attempt:
                self.clock.event("verify_recovered", version=version, attempts=attempt)
                log.info("engine verified again at v%d after %d re-apply(s)", version, attempt)
            return

    def _released(self, version: int) -> None:
        if self._read_done is not None:
            self._read_done(version)

    # ---- overlapped: the weights check runs while the engine generates (its samples wait for it)
    def start(self, version: int, manifest: Any, reapply: Any, staged: dict | None = None) -> None:
        """The probe (due or not) now; the weights check in a background thread (`settle` waits for it)."""
        self.settle()
        if self.probe_due(version):  # the probe needs the engine idle: before it generates, or after if the
            if self.hub.annotations(self.model, version).get(PROBE_KEY) is None:  # trainer has not annotated yet
                self._probe_later = (version, reapply)
            else:
                self.heal(version, None, reapply)
        if not self.cfg.weights or manifest is None:
            self._released(version)  # nothing will read the engine back
            return
        box: list = []
        readback = self.engine.weights_readback()  # views, now: the engine may hold a lock while it generates

        def run() -> None:
            t0 = time.perf_counter()
            try:
                self._weights(version, manifest, staged, readback)
            except BaseException as e:  # noqa: BLE001 - handed to settle()
                box.append(e)
            finally:
                self.seconds += time.perf_counter() - t0
        t = threading.Thread(target=run, name="rlsync-verify", daemon=True)
        t.start()
        self._pending = (version, manifest, staged, reapply, t, box)

    def settle(self) -> float:
        """Wait for an overlapped check (the seconds waited: its cost on the critical path); on a failure the
        version goes to `failed` (the engine generated with it) and is healed now."""
        later, self._probe_later = self._probe_later, None
        waited = self._settle_weights()
        if later is not None and later[0] == self.engine.version:  # annotated meanwhile (or skipped if never)
            self.heal(later[0], None, later[1], used=True)
        return waited

    def _settle_weights(self) -> float:
        if self._pending is None:
            return 0.0
        version, manifest, staged, reapply, t, box = self._pending
        self._pending = None
        t0 = time.perf_counter()
        t.join()
        waited = time.perf_counter() - t0
        err = box[0] if box else None
        if err is not None and not isinstance(err, WeightsVerifyError):
            raise err
        if err is None:
            self.clock.event("verify", version=version, seconds=waited, ok=True, overlapped=True, checks="weights")
        else:
            self.heal(version, manifest, reapply, staged, used=True, first=err)
        return waited
