"""`RolloutEngine`: sampling with HF `generate`, plus behaviour log-probs the trainer can trust.

    engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=4), model, pad_token_id=0, eos_token_id=2)
    out = engine.generate([p.prompt_ids for p in prompts])     # a `Rollout`
    batch = out.to_batch(rewards, group_ids)                   # a trainer `Batch`
    engine.named_parameters_for_sync()    # name -> live tensor (no copy): the hub writes into these
    engine.load_state(tensors, version=7) # or copy weights in from a mapping
    engine.sync_caps                      # EngineCaps: how weights may reach it (rlsync/sync/ reads this)
    engine.start_inflight("keep")         # in flight: fetch into engine.next_buffers(), engine.offer_next(v);
                                          # generate switches after a sampled token (out.token_versions)

Log-probs: after sampling, the sequences are re-scored with the trainer's own
`rlsync.core.logprobs.token_logprobs` (one extra forward), so an unchanged policy gives an
importance ratio of 1 (to float rounding) on the trainer, whatever `generate`'s KV-cache numerics.

A GRPO group (runs of g identical prompts) is prefilled once per distinct prompt and its KV cache repeated g times
(`_shared_prefill`, a serving engine's prefix cache in small): the samples' tokens then come from that cache.

In flight, a call that switched takes each token's log-prob from the step's own logits (the weights that
sampled it; `output_logits`, B x T x vocab floats: fine for tiny models), not the one-forward re-score.

Simplifies: one model, one process, fp32; no continuous batching (vLLM/SGLang are the adapters for GPUs).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import torch

from rlsync.core.batch import Batch, oldest_versions
from rlsync.core.engine_caps import EngineCaps
from rlsync.core.logprobs import token_logprobs

from .registry import register_engine

log = logging.getLogger(__name__)


class WeightMismatchError(ValueError):
    """Weights offered to `load_state` do not fit the engine's model (names, shapes or dtypes)."""


@dataclass(kw_only=True)
class Rollout:
    """Sampled responses, laid out as a trainer batch wants them (see `rlsync.core.batch`)."""

    input_ids: torch.Tensor
    """[B, T] left-padded prompt, then response, then right padding."""
    attention_mask: torch.Tensor
    """[B, T] 1 on prompt and response tokens."""
    response_mask: torch.Tensor
    """[B, T] 1 on response tokens, up to and including the first end token."""
    logprobs: torch.Tensor
    """[B, T] behaviour log-probs of each response token (0 elsewhere)."""
    response_ids: list[list[int]]
    """Each response's tokens, up to and including the end token if one was sampled."""
    version: int
    """Weight version that generated these responses."""
    token_versions: torch.Tensor | None = None
    """[B, T] long: the weight version that sampled each response token (the sample's version elsewhere);
    None = every token from `version`."""

    def to_batch(self, rewards: torch.Tensor, group_ids: torch.Tensor | None = None) -> Batch:
        """The trainer's `Batch`: per-token versions always set, each sample's `versions` the oldest of them."""
        own = torch.full((self.input_ids.shape[0],), self.version, dtype=torch.long)
        tv = (self.token_versions.long() if self.token_versions is not None
              else own.view(-1, 1).expand_as(self.input_ids).clone())
        return Batch(input_ids=self.input_ids, attention_mask=self.attention_mask, response_mask=self.response_mask,
                     old_logprobs=self.logprobs, rewards=rewards, group_ids=group_ids,
                     versions=oldest_versions(tv, self.response_mask, own), token_versions=tv)


@dataclass(kw_only=True, slots=True)
class SwitchStats:
    """A version switched in without draining (the hf engine's in-flight switch; vLLM's is its `SyncStats`)."""

    version: int
    pause_s: float
    """Decode stopped for it: re-pointing each parameter at the spare buffers (+ the re-prefill with `recompute`)."""
    in_flight: bool = True
    fetch_s: float = 0.0
    apply_s: float = 0.0
    fetch_wait_s: float = 0.0
    bytes_by_source: dict = field(default_factory=dict)


class _SwitchBetweenSteps:
    """A `StoppingCriteria` that never stops: HF `generate` calls it after each sampled token, before the next
    forward, which is the decode-step boundary where the engine may take a new version."""

    def __init__(self, engine: "RolloutEngine", prompt_len: int, pmask: torch.Tensor, cache):
        self.engine, self.p, self.pmask, self.cache = engine, prompt_len, pmask, cache
        self.spans: list[tuple[int, int]] = []
        """(version, first response token it sampled) for each switch in this call."""

    def __call__(self, input_ids: torch.Tensor, scores, **kw) -> torch.Tensor:
        n = input_ids.shape[1] - self.p  # tokens sampled so far; the next forward samples token n
        t0 = time.monotonic()
        v = self.engine._switch()
        if v is not None:
            if self.engine.kv_policy == "recompute":  # the cache covers every position but the last token
                self.engine._recompute(self.cache, input_ids[:, :-1], self.pmask, n - 1)
            self.spans.append((v, n))
            self.engine.switches[-1].pause_s = time.monotonic() - t0
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _fold_head_input(model: torch.nn.Module) -> None:
    """Give the LM head a row-major input. HF slices the kept positions (`logits_to_keep`, the re-score's `start`)
    out of the hidden states as a strided view; torch's matmul folds such a view into one mm only when something
    requires grad, so on a frozen model (adapter slots) it goes to bmm, which in bf16 copied the whole transposed
    head weight (49152 x 576, ~95 ms on one core for SmolLM2) at every forward: half a bf16 prefill."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        return

    def fold(_module, args):
        x = args[0]
        if any(x.stride(i) != x.stride(i + 1) * x.size(i + 1) for i in range(x.dim() - 2)):
            x = x.clone(memory_format=torch.contiguous_format)  # the kept rows only: 1 x 576 per prompt
        return (x, *args[1:])

    head.register_forward_pre_hook(fold)


class RolloutEngine:
    sync_caps: ClassVar[EngineCaps] = EngineCaps(in_place_fetch=True, load_state=True, inflight=True, verify=True,
                                                 adapters=True)
    """One process, plain torch parameters: the hub writes into them, or `load_state` copies in; in flight,
    the next version lands in spare tensors and each parameter is re-pointed at them between two decode steps;
    with adapters (`enable_adapters`), many LoRA adapters resident over the base (rollout/adapters.py)."""

    @dataclass(kw_only=True)
    class Config:
        temperature: float = 1.0
        """Sampling temperature (the trainer must use the same one for its log-probs)."""
        top_p: float = 1.0
        """Nucleus sampling mass; 1.0 samples from the whole distribution."""
        top_k: int = 0
        """Sample among the k most likely tokens; 0 disables."""
        max_new_tokens: int = 16
        """Longest response."""
        do_sample: bool = True
        """False: greedy decoding (log-probs are still of the temperature-scaled policy)."""
        tensor_parallel_size: int = 1
        """rollout.engine=vllm only: vLLM TP ranks, each reading only its slices from the hub (docs/vllm.md)."""

    def __init__(self, config: "RolloutEngine.Config", model: torch.nn.Module, *, pad_token_id: int,
                 eos_token_id: int):
        if config.tensor_parallel_size != 1:
            raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size} needs rollout.engine=vllm "
                             "(the hf engine runs one process)")
        self.config = config
        self.model = model.eval()
        _fold_head_input(self.model)
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.version = 0
        """Version of the weights the model holds (set by `load_state` or the caller)."""
        self.kv_policy: str | None = None
        """In-flight updates on (`start_inflight`): keep | recompute; None: off."""
        self._spare: dict[str, torch.Tensor] | None = None
        self._offered: int | None = None
        self._spare_lock = threading.Lock()
        self.switches: list[SwitchStats] = []
        self.adapters = None
        """`AdapterSlots` once `enable_adapters` ran (the model is then peft-wrapped); None: a plain model."""
        self.adapter = None
        """The adapter key (model, version) `generate` uses unless told another."""

    def enable_adapters(self, cfg, max_resident: int, extra: dict | None = None, merge: bool = False):
        """LoRA adapters over this engine's model from now on (`cfg`: an `rlsync.core.lora.LoraConfig`); at most
        `max_resident` at once (LRU); `merge`: sample with the adapter merged into a copy of the weights.
        Returns the `AdapterSlots` (the receiver fetches into its slots)."""
        from .adapters import AdapterSlots

        if self.kv_policy is not None:
            raise ValueError("adapters and in-flight updates together are not supported (sync.inflight=false)")
        if self.adapters is None:
            self.adapters = AdapterSlots(self.model, cfg, max_resident, extra=extra, merge=merge)
            self.model = self.adapters.model
        return self.adapters

    def use_adapter(self, key, version: int) -> None:
        """`generate` uses adapter `key` (resident) from now on; `version` becomes the engine's version."""
        if not self.adapters.has(key):
            raise KeyError(f"adapter {key} is not resident")
        self.adapter, self.version = key, version

    def _generation_config(self):
        from transformers import GenerationConfig

        c = self.config
        kw = dict(max_new_tokens=c.max_new_tokens, do_sample=c.do_sample, pad_token_id=self.pad_token_id,
                  eos_token_id=self.eos_token_id)
        if c.do_sample:
            kw.update(temperature=c.temperature, top_p=c.top_p, top_k=c.top_k)
        return GenerationConfig(**kw)

    def left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        p = max(len(x) for x in prompts)
        ids = torch.full((len(prompts), p), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), p), dtype=torch.long)
        for i, x in enumerate(prompts):
            if not x:
                raise ValueError(f"prompt {i} is empty")
            ids[i, p - len(x):] = torch.tensor(x)
            mask[i, p - len(x):] = 1
        return ids, mask

    def generate(self, prompts: list[list[int]], adapter=None, *, streamer=None) -> Rollout:
        """Sample one response per prompt (repeat a prompt in the list for a GRPO group). In flight, a version
        offered meanwhile is switched in after a sampled token (`token_versions` says which sampled each).
        With adapters: under `adapter` (default `self.adapter`), pinned until the call returns. `streamer`: an HF
        `BaseStreamer`, given the prompt, then each sampled token as it is sampled (time to first token)."""
        if self.adapters is None:
            return self._generate(prompts, streamer)
        key = self.adapter if adapter is None else adapter
        with self.adapters.use(key):
            out = self._generate(prompts, streamer)
        if adapter is not None:
            out.version = adapter[1]
        return out

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], streamer=None) -> Rollout:
        ids, pmask = self.left_pad(prompts)
        p = ids.shape[1]
        version = self._switch(in_flight=False) or self.version
        kw = {}
        if self.kv_policy is not None:
            from transformers import DynamicCache, StoppingCriteriaList

            hook = _SwitchBetweenSteps(self, p, pmask, DynamicCache(config=self.model.config))
            kw = dict(stopping_criteria=StoppingCriteriaList([hook]), past_key_values=hook.cache,
                      return_dict_in_generate=True, output_logits=True)
        shared = None if kw else self._shared_prefill(prompts, ids, pmask)
        out = self.model.generate(input_ids=ids, attention_mask=pmask, generation_config=self._generation_config(),
                                  streamer=streamer, **kw, **({} if shared is None else {"past_key_values": shared}))
        seq = out.sequences if kw else out
        resp = seq[:, p:]
        # Response mask: every token up to and including the first end token.
        is_eos = resp == self.eos_token_id
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        rmask = (~after_eos).long()
        attn = torch.cat([pmask, rmask], dim=1)
        response_mask = torch.cat([torch.zeros_like(pmask), rmask], dim=1)
        seq = torch.where(attn.bool(), seq, torch.full_like(seq, self.pad_token_id))
        tv = None
        if kw and hook.spans:
            # each token's log-prob under the weights that sampled it, from the step's own logits
            steps = torch.stack(out.logits, 1).float() / self.config.temperature
            lp_resp = torch.log_softmax(steps, -1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)
            lp = torch.cat([torch.zeros_like(pmask, dtype=lp_resp.dtype), lp_resp], dim=1)
            tv = torch.full_like(seq, version)
            for v, first in hook.spans:
                tv[:, p + first:] = v
        else:
            lp, _ = token_logprobs(self.model, seq, attn, temperature=self.config.temperature, start=p)
        lp = lp * response_mask
        response_ids = [r[m.bool()].tolist() for r, m in zip(resp, rmask)]
        return Rollout(input_ids=seq, attention_mask=attn, response_mask=response_mask, logprobs=lp,
                       response_ids=response_ids, version=version, token_versions=tv)

    def _shared_prefill(self, prompts: list[list[int]], ids: torch.Tensor, pmask: torch.Tensor):
        """Prompts in runs of g identical ones (a GRPO group): the KV cache of all but their last token, each
        distinct prompt computed once and repeated g times (what a serving engine's prefix cache does); `generate`
        then computes only the last prompt token per sample. None when no prompt repeats."""
        g = next((i for i, x in enumerate(prompts) if x != prompts[0]), len(prompts))
        if g < 2 or ids.shape[1] < 2 or len(prompts) % g or any(prompts[i] != prompts[i - i % g]
                                                                 for i in range(len(prompts))):
            return None
        from transformers import DynamicCache

        mask = pmask[::g, :-1]
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=ids[::g, :-1], attention_mask=mask, past_key_values=cache, use_cache=True,
                   position_ids=(mask.cumsum(-1) - 1).masked_fill(mask == 0, 1))
        cache.batch_repeat_interleave(g)
        return cache

    # ------------------------------------------------------------------ in-flight (EngineCaps.inflight)
    def start_inflight(self, kv_policy: str = "keep") -> None:
        """Take versions offered into the spare buffers between decode steps (`kv_policy`: keep | recompute)."""
        if kv_policy not in ("keep", "recompute"):
            raise ValueError(f"kv policy must be 'keep' or 'recompute' (got {kv_policy!r})")
        if self.adapters is not None:
            raise ValueError("adapters and in-flight updates together are not supported (sync.inflight=false)")
        self.kv_policy = kv_policy

    def next_buffers(self) -> dict[str, torch.Tensor]:
        """name -> the spare tensors the next version is fetched into (never the live ones); a version offered
        before and not yet switched in is withdrawn (its buffers are about to be overwritten)."""
        with self._spare_lock:
            if self._spare is None:
                self._spare = {n: torch.empty_like(t) for n, t in self.named_parameters_for_sync().items()}
            self._offered = None
            return dict(self._spare)

    def offer_next(self, version: int) -> None:
        """The spare buffers hold `version`, complete: switch at the next decode-step boundary (or call)."""
        with self._spare_lock:
            self._offered = version

    def switch_prepared(self) -> SwitchStats | None:
        """Between calls: switch an offered newer version in now."""
        return self.switches.pop() if self._switch(in_flight=False) is not None else None

    def take_switches(self) -> list[SwitchStats]:
        out, self.switches = self.switches, []
        return out

    def _switch(self, in_flight: bool = True) -> int | None:
        """Re-point every parameter at the spare buffers when they hold a newer version; the old live
        tensors become the spare (the next fetch into them releases their version first)."""
        t0 = time.monotonic()
        with self._spare_lock:
            v, self._offered = self._offered, None
            if v is None or v <= self.version:
                return None
            params = dict(self.model.named_parameters())
            for n, t in self._spare.items():
                old = params[n].data
                params[n].data = t
                self._spare[n] = old
            self.version = v
        self.switches.append(SwitchStats(version=v, pause_s=time.monotonic() - t0, in_flight=in_flight))
        return v

    def _recompute(self, cache, ids: torch.Tensor, pmask: torch.Tensor, n: int) -> None:
        """`recompute`: rebuild `cache` (in place: `generate` holds it) for `ids` under the new weights."""
        from transformers import DynamicCache

        mask = torch.cat([pmask, torch.ones(pmask.shape[0], n, dtype=pmask.dtype)], dim=1)
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        fresh = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                           past_key_values=DynamicCache(config=self.model.config), use_cache=True).past_key_values
        for live, new in zip(cache.layers, fresh.layers):
            live.keys, live.values = new.keys, new.values

    def named_parameters_for_sync(self) -> dict[str, torch.Tensor]:
        """name -> the model's live parameter tensor (no copy), named as the trainer names them.

        Writing into these tensors changes the model: the hub fetches weights straight into them.
        """
        return {name: p.data for name, p in self.model.named_parameters()}

    # ------------------------------------------------------------------ verification (EngineCaps.verify)
    def weights_readback(self) -> dict[str, torch.Tensor]:
        """name -> the tensor the forward reads now (after an in-flight switch: the former spare), no copy."""
        return self.named_parameters_for_sync()

    @property
    def compute_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @torch.no_grad()
    def probe_logprobs(self, tokens: list[int]) -> list[float]:
        """log p(tokens[t] | tokens[:t]) for t >= 1 (temperature 1): the fixed-probe check (docs/verify.md)."""
        ids = torch.tensor([tokens])
        lp, _ = token_logprobs(self.model, ids, torch.ones_like(ids), temperature=1.0)
        return lp[0, 1:].tolist()

    @torch.no_grad()
    def load_state(self, tensors: Mapping[str, torch.Tensor], version: int | None = None) -> None:
        """Copy `tensors` (all of the model's parameters, by name) into the model.

        Everything is checked before anything is written: a mismatch raises and changes no weight.
        """
        live = self.named_parameters_for_sync()
        missing, extra = sorted(set(live) - set(tensors)), sorted(set(tensors) - set(live))
        if missing or extra:
            raise WeightMismatchError(f"weights do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
        for name, t in tensors.items():
            if t.shape != live[name].shape or t.dtype != live[name].dtype:
                raise WeightMismatchError(f"{name}: got {t.dtype} {tuple(t.shape)}, model has "
                                          f"{live[name].dtype} {tuple(live[name].shape)}")
        for name, t in tensors.items():
            live[name].copy_(t)
        if version is not None:
            self.version = version


@register_engine("hf")
def build_hf_engine(sampling: RolloutEngine.Config, model: torch.nn.Module, *, pad_token_id: int, eos_token_id: int,
                    model_cfg: object = None) -> RolloutEngine:
    """HF `generate` on the loader's model (tiny models and CPU runs)."""
    return RolloutEngine(sampling, model, pad_token_id=pad_token_id, eos_token_id=eos_token_id)
