"""The vLLM engine's decode loop, step by step, so a new weight version can be switched in between two steps.

    seqs = decode(llm, prompts, params, version=7, between=switch, kv="keep")
    seqs[i].tokens, seqs[i].logprobs, seqs[i].spans    # spans: [(7, 0), (8, 5)] = tokens 0-4 by v7, 5- by v8

`LLM.generate` runs every request to completion in one call; here the requests are added to the engine
(`LLMEngine.add_request`, outputs as deltas) and `LLMEngine.step()` is called until none is unfinished.
After each step, `between()` may switch weights (it returns the new version, or None). On CPU vLLM
schedules synchronously (no async scheduling: checked at start), so every token a step returned was
sampled with the weights held during that step, and every token after the switch with the new ones.

KV policy on a switch (`kv`):
- `keep` (PipelineRL): requests in flight continue on the KV cache the old weights computed; the
  tokens after the switch are the new weights' over that stale cache. No cost.
- `recompute`: every request in flight is aborted and added again as prompt + tokens so far, so its
  whole context is prefilled again under the new weights (and what follows is exactly what the new
  version would sample after that prefix). Cost: one prefill of every in-flight sequence per switch.

Prefix caching: every request carries `cache_salt="v<version>"`, so a request never reuses KV blocks
another version computed (without it a prompt seen before a switch would be served from the old
weights' cache, in-flight or drained update alike).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import torch

_ids = itertools.count()


@dataclass(slots=True)
class Seq:
    """One response being generated."""

    prompt: list[int]
    rid: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    """(version, first token index) each time the sampling version changed; the first at index 0."""
    done: bool = False


def check_sync_scheduling(llm) -> None:
    """The token-to-version attribution needs each step's outputs to be that step's tokens."""
    if getattr(llm.llm_engine.vllm_config.scheduler_config, "async_scheduling", False):
        raise RuntimeError("in-flight updates need vLLM's synchronous scheduling (async_scheduling is on: a "
                           "step's outputs would lag its forward pass and tokens could be given the wrong version)")


def _add(llm, seq: Seq, params, version: int) -> None:
    from vllm.inputs import TokensPrompt

    seq.rid = f"rlsync-{next(_ids)}"
    prompt = TokensPrompt(prompt_token_ids=seq.prompt + seq.tokens, cache_salt=f"v{version}")
    llm.llm_engine.add_request(seq.rid, prompt, params)


def _same_omp_threads() -> None:
    """Give the calling thread torch's intra-op thread count before vLLM steps in it. vLLM's CPU attention
    sizes its schedule with the thread's OpenMP count (omp_get_max_threads) and runs with torch's
    (at::get_num_threads, set lazily per thread): in a thread that has not run a torch parallel op yet (a
    Ray actor's pool thread while in-flight staging runs elsewhere) they differ when vLLM bound more cores
    than OMP_NUM_THREADS says, and the kernel aborts ("metadata->thread_num == thread_num (1 vs. 2)").
    `get_num_threads` does torch's per-thread initialisation, which sets the thread's OpenMP count
    (docs/vllm.md)."""
    torch.get_num_threads()


def decode(llm, prompts: list[list[int]], params, version: int,
           between: Callable[[], int | None] | None = None, kv: str = "keep") -> list[Seq]:
    """Generate one response per prompt; `between()` runs after every step and returns a version it
    switched the weights to (None: no switch). Returns the sequences in prompt order."""
    from vllm.sampling_params import RequestOutputKind

    if kv not in ("keep", "recompute"):
        raise ValueError(f"kv policy must be 'keep' or 'recompute' (got {kv!r})")
    _same_omp_threads()
    params = params.clone()
    params.output_kind = RequestOutputKind.DELTA
    seqs = [Seq(prompt=list(p), spans=[(version, 0)]) for p in prompts]
    by_rid: dict[str, Seq] = {}
    for s in seqs:
        _add(llm, s, params, version)
        by_rid[s.rid] = s
    engine = llm.llm_engine
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                s = by_rid.get(out.request_id)
                if s is None:
                    continue  # an aborted request's last words
                c = out.outputs[0]
                s.tokens.extend(c.token_ids)
                s.logprobs.extend(d[t].logprob for d, t in zip(c.logprobs or [], c.token_ids))
                s.done = out.finished
            live = [s for s in seqs if not s.done]
            new = between() if between is not None and live else None
            if new is None:
                continue
            for s in live:
                s.spans.append((new, len(s.tokens)))
            if kv == "recompute":
                engine.abort_request([s.rid for s in live])
                for s in live:
                    del by_rid[s.rid]
                    left = params.clone()
                    left.max_tokens = params.max_tokens - len(s.tokens)
                    _add(llm, s, left, new)
                    by_rid[s.rid] = s
    except BaseException:
        engine.abort_request([s.rid for s in seqs if not s.done])
        raise
    return seqs
