"""`VllmEngine`: sampling with vLLM (CPU or CUDA) plus per-token behaviour log-probs, and in-place
weight updates through vLLM's layerwise reload.

    engine = VllmEngine(VllmEngine.Config(max_new_tokens=16))      # model_dir: SmolLM2 by default
    out = engine.generate([[1, 504, 3458], [1, 504, 3458]])         # a `Rollout`, tagged out.version
    engine.apply(staged_tensors.items(), version=7)                 # between batches, in place

Versions: `generate` and `apply` take one lock, so an update waits for the batch in flight and a
batch never mixes two versions; every `Rollout` carries the version the engine held for all of it.

Log-probs: vLLM returns the sampled token's log-prob of the temperature-scaled distribution
(`logprobs_mode="processed_logprobs"`), computed in the engine's dtype (bf16 weights). The trainer
recomputes them in its own precision; the gap is a metric (`rollout/logprob_gap`), not an error.

In-place apply: the CPU backend repacks linear weights after loading (the qkv/o/gate_up/down
`nn.Parameter`s become size 0), so writing into parameters changes nothing. `apply` runs, inside
the worker (worker_apply.py), the direct apply or the layerwise reload (`initialize_layerwise_reload`,
`model.load_weights`, `finalize_layerwise_reload`, what `reload_weights(is_checkpoint_format=True)`
does) on tensors in checkpoint names, so each layer is re-processed as soon as its weights are in. With
`VLLM_ENABLE_V1_MULTIPROCESSING=0` the worker runs in this process and reads the caller's
tensors directly (no serialization, no copy besides vLLM's own repacking).

Tensor parallel (`tensor_parallel_size=k > 1`, rollout/vllm/tp.py): vLLM runs k worker processes
(`mp` executor, gloo) with rlsync's worker extension; `apply` cannot reach them (it sends Python
callables), so weights arrive by `join_hub` + `load_version`: every rank reads only its slices from
the hub and applies them in place (named collective_rpc methods). A model TP=k cannot split is
refused before vLLM starts (`TensorParallelError`).

Simplifies: the `LLM` offline API, batch by batch.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Iterable

import torch

from ..engine import Rollout
from .decode import check_sync_scheduling, decode
from .tp import TensorParallelError, check_tensor_parallel  # noqa: F401 - TensorParallelError: callers import it here
from .worker_apply import (direct_readback, direct_reload, inflight_build, inflight_swap, layerwise_reload,
                           quiet_dtype_notes)

log = logging.getLogger(__name__)


class WeightApplyError(RuntimeError):
    """An update could not be applied completely; the engine refuses to generate until a good one is."""


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(slots=True)
class Switch:
    """A version switched in without draining (`VllmEngine.prepare`, then a decode-step boundary)."""

    version: int
    pause_s: float
    """Decode stopped for it: the reference swap (and the caches a reload resets)."""
    build_s: float
    """Building it beside the live weights, off the decode path."""
    in_flight: bool
    """Switched between two decode steps of a running `generate` (False: between calls)."""
    at: float = 0.0
    """time.monotonic() when it was switched in (a version's lag from its publish: `bench inflight`)."""


@dataclass(slots=True)
class _Prepared:
    version: int
    built: object
    specs: tuple
    build_s: float


def _vllm_env(kv_cache_gib: int, threads: int | None) -> None:
    # vLLM reads these when the engine starts: an in-process worker (so collective_rpc callables see
    # our tensors) and a KV cache sized for a small machine.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    if threads:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


class VllmEngine:
    @dataclass(kw_only=True)
    class Config:
        model_dir: str | None = None
        """HF directory of the model; None prepares SmolLM2-135M-Instruct (`rollout.vllm.model_dir`)."""
        dtype: str = "bfloat16"
        """Weights' dtype inside vLLM."""
        max_model_len: int = 512
        """Longest sequence (prompt + response) the engine accepts."""
        kv_cache_gib: int = 1
        """CPU KV cache size (VLLM_CPU_KVCACHE_SPACE) when the environment does not set it."""
        threads: int | None = None
        """OMP threads for the CPU backend when the environment does not set them (None: vLLM's choice)."""
        temperature: float = 1.0
        """Sampling temperature (the trainer uses the same one for its log-probs)."""
        top_p: float = 1.0
        """Nucleus sampling mass; 1.0 samples from the whole distribution."""
        top_k: int = 0
        """Sample among the k most likely tokens; 0 disables."""
        max_new_tokens: int = 16
        """Longest response."""
        do_sample: bool = True
        """False: greedy decoding (log-probs are still of the temperature-scaled policy)."""
        kv_policy: str = "keep"
        """In-flight updates (`prepare`): what requests in flight do at a switch. "keep" continues on the KV
        cache the old weights computed (PipelineRL; free); "recompute" prefills each in-flight sequence again
        under the new weights (one prefill per sequence per switch). rollout/vllm/decode.py."""
        seed: int = 0
        """Engine seed (sampling is reproducible for one engine and one batch order)."""
        gpu_memory_utilization: float = 0.5
        """Share of GPU memory vLLM may take (CUDA only)."""
        apply_mode: str = "direct"
        """How `apply` writes a version: "direct" (rollout/vllm/direct.py: one converting copy per tensor
        into buffers laid out like vLLM's fused parameters, then each layer's own repacking; falls back
        to the layerwise reload for a model it cannot place) or "layerwise" (vLLM's layerwise reload)."""
        tensor_parallel_size: int = 1
        """vLLM TP ranks (k > 1: k worker processes on gloo, each reading only its slices from the hub;
        heads, KV heads and MLP width must divide by k; on CPU set VLLM_CPU_OMP_THREADS_BIND, e.g. "0|1")."""
        load_format: str = "auto"
        """vLLM's weight loader. "dummy" (a warm spot joiner, docs/elastic.md): random weights, the checkpoint
        is never read (the directory needs only config.json and the tokenizer); the engine refuses to generate
        until a version is applied from the hub."""

    def __init__(self, config: "VllmEngine.Config", *, eos_token_id: int | None = None,
                 pad_token_id: int | None = None):
        from .model_dir import checkpoint_variant, prepare_smollm2

        self.config = config
        self.model_dir = config.model_dir or prepare_smollm2()
        self.start_variant = checkpoint_variant(self.model_dir)  # `int8`: loaded in that variant's layout
        check_tensor_parallel(self.model_dir, config)  # before any process starts or weight moves
        from .engine_cache import use_engine_compile_cache

        use_engine_compile_cache()  # vLLM's compiled sampler kernel: under the cache root a joiner takes from peers
        tp = config.tensor_parallel_size
        if tp == 1:
            _vllm_env(config.kv_cache_gib, config.threads)
            extra = {}
        else:  # workers are processes of their own: the caller must guard `__main__` (docs/vllm.md)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.kv_cache_gib))
            from .tp import EXTENSION

            extra = dict(tensor_parallel_size=tp, distributed_executor_backend="mp", worker_extension_cls=EXTENSION)
        # a directory without a tokenizer (a tiny test model): token ids in, token ids out
        self._no_tokenizer = not any(os.path.exists(os.path.join(self.model_dir, f)) for f in _TOKENIZER_FILES)
        if self._no_tokenizer:
            if eos_token_id is None:
                raise ValueError(f"{self.model_dir} has no tokenizer: pass eos_token_id")
            extra["skip_tokenizer_init"] = True
        from vllm import LLM

        gc.freeze()  # vLLM's start-up runs full collections; the imported modules' objects need no traversal
        t0 = time.monotonic()
        self.llm = LLM(model=self.model_dir, dtype=config.dtype, enforce_eager=True, seed=config.seed,
                       max_model_len=config.max_model_len, logprobs_mode="processed_logprobs",
                       gpu_memory_utilization=config.gpu_memory_utilization, load_format=config.load_format,
                       **extra)
        self.start_s = time.monotonic() - t0
        quiet_dtype_notes()
        tok = None if self._no_tokenizer else self.llm.get_tokenizer()
        self.eos_token_id = eos_token_id if eos_token_id is not None else tok.eos_token_id
        self.pad_token_id = pad_token_id if pad_token_id is not None else (
            tok.pad_token_id if tok is not None and tok.pad_token_id is not None else self.eos_token_id)
        self._lock = threading.Lock()
        self._version = 0
        self._broken: str | None = ("dummy weights (load_format='dummy')"
                                    if config.load_format == "dummy" else None)
        self._prepared: _Prepared | None = None
        self._prepared_lock = threading.Lock()
        self._build_lock = threading.Lock()
        self.switches: list[Switch] = []
        """Every version switched in by reference (`prepare`), in order; the weights' path drains it."""
        check_sync_scheduling(self.llm)
        log.info("vLLM engine on %s started in %.1fs", self.model_dir, self.start_s)

    # ------------------------------------------------------------------ versions
    @property
    def version(self) -> int:
        """Version of the weights the engine holds (0: the model directory's own weights)."""
        return self._version

    def set_version(self, version: int) -> None:
        """Tag the weights the engine holds (e.g. version 0 published from the same directory)."""
        with self._lock:
            self._version = version

    # ------------------------------------------------------------------ sampling
    def _sampling_params(self):
        from vllm import SamplingParams

        c = self.config
        ids = {"detokenize": False} if self._no_tokenizer else {}
        if c.do_sample:
            return SamplingParams(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k or -1,
                                  max_tokens=c.max_new_tokens, logprobs=0, stop_token_ids=[self.eos_token_id], **ids)
        return SamplingParams(temperature=0.0, max_tokens=c.max_new_tokens, logprobs=0,
                              stop_token_ids=[self.eos_token_id], **ids)

    def generate(self, prompts: list[list[int]]) -> Rollout:
        """Sample one response per prompt (repeat a prompt in the list for a GRPO group).

        The whole batch runs under the engine lock: an `apply` waits for it, so every response
        comes from `Rollout.version`.
        """
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
        with self._lock:
            if self._broken:
                raise WeightApplyError(f"engine holds incomplete weights ({self._broken}); apply a good version first")
            self._switch(in_flight=False)  # a version prepared while idle
            version = self._version
            seqs = decode(self.llm, prompts, self._sampling_params(), version, between=self._switch,
                          kv=self.config.kv_policy)
        return self._layout(prompts, [s.tokens for s in seqs], [s.logprobs for s in seqs], version,
                            [s.spans for s in seqs])

    def warm_up(self, prompt: list[int], n: int = 2) -> float:
        """One batch of `n` copies of `prompt` on whatever weights are loaded (dummy ones too), dropped, no version:
        a process's first generate pays set-up (the sampler kernel, first-shape buffers: 2.6-6.7 s here,
        docs/vllm.md) that a joiner pays before it takes a version, not between that version and its first sample."""
        with self._lock:
            t0 = time.monotonic()
            decode(self.llm, [list(prompt)] * n, self._sampling_params(), self._version)
            return time.monotonic() - t0

    def _layout(self, prompts, resp, lps, version: int, spans=None) -> Rollout:
        """Left-padded prompt, response, right padding: the layout `RolloutEngine` produces. `spans`: per
        sample, (version, first token) each time its sampling version changed (`token_versions`)."""
        b = len(prompts)
        p, r = max(len(x) for x in prompts), max([len(x) for x in resp] + [1])
        ids = torch.full((b, p + r), self.pad_token_id, dtype=torch.long)
        attn = torch.zeros((b, p + r), dtype=torch.long)
        rmask = torch.zeros((b, p + r), dtype=torch.long)
        lp = torch.zeros((b, p + r), dtype=torch.float32)
        for i, (x, y, l) in enumerate(zip(prompts, resp, lps)):
            ids[i, p - len(x):p] = torch.tensor(x)
            attn[i, p - len(x):p + len(y)] = 1
            if y:
                ids[i, p:p + len(y)] = torch.tensor(y)
                rmask[i, p:p + len(y)] = 1
                lp[i, p:p + len(y)] = torch.tensor(l, dtype=torch.float32)
        tv = None
        if spans and any(len({v for v, _ in sp}) > 1 for sp in spans):
            tv = torch.full((b, p + r), version, dtype=torch.long)
            for i, sp in enumerate(spans):
                for v, first in sp:
                    tv[i, p + first:] = v
        return Rollout(input_ids=ids, attention_mask=attn, response_mask=rmask, logprobs=lp,
                       response_ids=resp, version=version, token_versions=tv)

    # ------------------------------------------------------------------ weights
    def apply(self, weights: Iterable[tuple[str, torch.Tensor]], version: int, *,
              expect: Iterable[str] | None = None, specs: list[tuple[str, tuple[int, ...]]] | None = None,
              mode: str | None = None) -> float:
        """Load `weights` (checkpoint names, any dtype) in place; returns seconds.

        Waits for the batch in flight. `expect`: names that must all have been loaded, else the
        update fails loudly (`WeightApplyError`) and the engine refuses to generate until a
        complete version is applied. An exception from `weights` (e.g. an integrity check) does
        the same. `specs` (name, shape of every tensor of the version) enables the direct apply
        (`Config.apply_mode`, or `mode` for this call); without them the layerwise reload runs.
        """
        if self.config.tensor_parallel_size > 1:
            raise TensorParallelError("apply sends Python callables, which cannot reach TP workers in other "
                                      "processes: use join_hub + load_version at tensor_parallel_size > 1")
        expected = set(expect) if expect is not None else None
        mode = mode or self.config.apply_mode
        if mode not in ("direct", "layerwise"):
            raise ValueError(f"apply mode must be 'direct' or 'layerwise' (got {mode!r})")
        with self._lock:
            t0 = time.monotonic()
            try:
                if mode == "direct" and specs is not None:
                    loaded = self.llm.collective_rpc(direct_reload, args=(tuple(specs), weights))[0]
                else:
                    loaded = self.llm.collective_rpc(layerwise_reload, args=(weights,))[0]
            except BaseException as e:
                self._broken = f"update to v{version} failed: {e}"
                raise
            if expected is not None and not expected <= loaded:
                missing = sorted(expected - loaded)
                self._broken = f"update to v{version} missed {len(missing)} tensors"
                raise WeightApplyError(f"update to v{version}: vLLM did not load {missing[:5]}")
            self._version = version
            self._broken = None
            return time.monotonic() - t0

    # ------------------------------------------------------------------ in-flight updates
    def prepare(self, weights: Iterable[tuple[str, torch.Tensor]], version: int, *,
                specs: list[tuple[str, tuple[int, ...]]], expect: Iterable[str] | None = None) -> bool:
        """Build `version` beside the live weights (rollout/vllm/double_buffer.py) while the engine keeps
        generating; it is switched in at the next decode-step boundary of a running `generate` (or at the
        start of the next one, or by `switch_prepared`). False (nothing changed) when this layout has no
        double buffer (the direct plan cannot place it: use `apply`). An exception from `weights` or a
        missing tensor leaves the live weights, and any version prepared before, as they were."""
        if self.config.tensor_parallel_size > 1:
            raise TensorParallelError("in-flight updates run at tensor_parallel_size=1 only")
        specs = tuple(specs)
        with self._build_lock:
            t0 = time.monotonic()
            built = self.llm.collective_rpc(inflight_build, args=(specs, weights))[0]
            if built is None:
                return False
            if expect is not None and not set(expect) <= built.names:
                missing = sorted(set(expect) - built.names)
                raise WeightApplyError(f"in-flight build of v{version}: vLLM did not load {missing[:5]}")
            with self._prepared_lock:
                self._prepared = _Prepared(version, built, specs, time.monotonic() - t0)
        return True

    def switch_prepared(self) -> Switch | None:
        """Between calls: switch a prepared version in now (waits for the batch in flight)."""
        with self._lock:
            return self.switches[-1] if self._switch(in_flight=False) is not None else None

    def _switch(self, in_flight: bool = True) -> int | None:
        """Under the engine lock, between two decode steps (or calls): take a prepared newer version."""
        with self._prepared_lock:
            p, self._prepared = self._prepared, None
        if p is None or p.version <= self._version or self._broken:
            return None
        t0 = time.monotonic()
        if not self.llm.collective_rpc(inflight_swap, args=(p.specs, p.built))[0]:
            return None  # a newer build overwrote its slot: that one will be prepared next
        self._version = p.version
        self.switches.append(Switch(p.version, time.monotonic() - t0, p.build_s, in_flight, time.monotonic()))
        return p.version

    # ------------------------------------------------------------------ verification (docs/verify.md)
    def readback(self, specs) -> dict[str, torch.Tensor]:
        """Checkpoint name -> the engine's own bytes for it after the direct apply ({}: layerwise-applied)."""
        with self._lock:
            return self.llm.collective_rpc(direct_readback, args=(tuple(specs),))[0]

    def probe_logprobs(self, tokens: list[int]) -> list[float]:
        """log p(tokens[t] | tokens[:t]) for t >= 1 at temperature 1 (vLLM's prompt log-probs)."""
        from vllm import SamplingParams

        with self._lock:
            out = self.llm.generate([{"prompt_token_ids": list(tokens)}],
                                    SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        return [lp[t].logprob for lp, t in zip(out[0].prompt_logprobs[1:], tokens[1:])]

    def join_hub(self, address: str, token: str | None, host: str, name: str) -> list[str]:
        """TP > 1: every worker joins the hub at `address` as `name`-tp<rank>; returns their worker ids."""
        return self.llm.collective_rpc("rlsync_join", args=(address, token, host, name))

    def load_version(self, model: str, version: int, layout=None, *, digests: bool = False) -> list[dict]:
        """TP > 1: every rank reads only its slices of `version` from the hub (`layout`: the trainer's
        ZeRO-3 `ShardedLayout`; None: a whole-tensor version) and applies them in place. Waits for the
        batch in flight. A failed read on any rank raises and leaves every rank's weights and the
        engine's version as they were; a failed apply marks the engine broken (as `apply` does)."""
        from .tp import TPLoadError, load_slices

        with self._lock:
            try:
                ranks = load_slices(self.llm, model, version, layout, digests=digests)
            except TPLoadError as e:
                if e.applied:  # some rank's layers were being written: not a whole version
                    self._broken = f"update to v{version} failed: {e}"
                raise
            self._version, self._broken = version, None
            return ranks

    def shutdown(self) -> None:
        """Free the engine (its KV cache and weights)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as e:  # noqa: BLE001 - best effort at teardown
                log.debug("vLLM shutdown: %s", e)

