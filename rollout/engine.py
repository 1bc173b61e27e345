"""`RolloutEngine`: sampling with HF `generate`, plus behaviour log-probs the trainer can trust.

    engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=4), model, pad_token_id=0, eos_token_id=2)
    out = engine.generate([p.prompt_ids for p in prompts])     # a `Rollout`
    batch = out.to_batch(rewards, group_ids)                   # a trainer `Batch`
    engine.named_parameters_for_sync()    # name -> live tensor (no copy): the hub writes into these
    engine.load_state(tensors, version=7) # or copy weights in from a mapping
    engine.sync_caps                      # EngineCaps: how weights may reach it (rlsync/sync/ reads this)

Log-probs: after sampling, the sequences are re-scored with the trainer's own
`rlsync.core.logprobs.token_logprobs` (one extra forward), so an unchanged policy gives an
importance ratio of 1 (to float rounding) on the trainer, whatever `generate`'s KV-cache numerics.

Simplifies: one model, one process, fp32; no continuous batching (vLLM/SGLang are the adapters for GPUs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
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


class RolloutEngine:
    sync_caps: ClassVar[EngineCaps] = EngineCaps(in_place_fetch=True, load_state=True)
    """One process, plain torch parameters: the hub writes into them, or `load_state` copies in."""

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
        self.pad_token_id, self.eos_token_id = pad_token_id, eos_token_id
        self.version = 0
        """Version of the weights the model holds (set by `load_state` or the caller)."""

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

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> Rollout:
        """Sample one response per prompt (repeat a prompt in the list for a GRPO group)."""
        ids, pmask = self.left_pad(prompts)
        p = ids.shape[1]
        seq = self.model.generate(input_ids=ids, attention_mask=pmask, generation_config=self._generation_config())
        resp = seq[:, p:]
        # Response mask: every token up to and including the first end token.
        is_eos = resp == self.eos_token_id
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        rmask = (~after_eos).long()
        attn = torch.cat([pmask, rmask], dim=1)
        response_mask = torch.cat([torch.zeros_like(pmask), rmask], dim=1)
        seq = torch.where(attn.bool(), seq, torch.full_like(seq, self.pad_token_id))
        lp, _ = token_logprobs(self.model, seq, attn, temperature=self.config.temperature)
        lp = lp * response_mask
        response_ids = [r[m.bool()].tolist() for r, m in zip(resp, rmask)]
        return Rollout(input_ids=seq, attention_mask=attn, response_mask=response_mask, logprobs=lp,
                       response_ids=response_ids, version=self.version)

    def named_parameters_for_sync(self) -> dict[str, torch.Tensor]:
        """name -> the model's live parameter tensor (no copy), named as the trainer names them.

        Writing into these tensors changes the model: the hub fetches weights straight into them.
        """
        return {name: p.data for name, p in self.model.named_parameters()}

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
