"""Generate and score n samples per prompt: one engine call (single-turn) or an episode loop (multi-turn).

    out, rewards = generate_scored(engine, task, prompts, n)   # a `Rollout` ([B, T] batch layout) + [B] rewards

Multi-turn (`task.multi_turn`): every sample is an episode with its own `Environment` (environment.py).
Each turn, all live episodes go to the engine in one `generate` call whose prompts are the episodes'
whole token histories; the reply's tokens and behaviour log-probs are kept as sampled, the environment's
answer is appended as tokens (`env_turn_ids`), and the episode goes on until the environment says done
or `task.max_turns` replies. The result is one sequence per episode, laid out like a single-turn
`Rollout`: the first prompt left-padded, then every later token; `response_mask` is 1 on the model's
tokens only, so environment tokens are context the loss never trains on.

Prefix reuse: an episode's turns all run on the engine of the worker that started it (this loop, in one
rollout call), and each turn's prompt extends the previous one, so an engine with prefix caching (vLLM)
reuses the session's KV cache; HF `generate` recomputes it.

Simplifies: the engine's public `generate` is called per turn (a finished episode waits for the turn's
slowest one); a sample's version is the oldest of its turns' (`Episode.versions` keeps each turn's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .engine import Rollout
from .environment import env_turn_ids
from .rewards import Prompt
from .tasks import decode_response


def generate_scored(engine: Any, task: Any, prompts: list[Prompt], n: int) -> tuple[Rollout, torch.Tensor]:
    """`n` samples of every prompt (a GRPO group), scored by the task: (rollout, rewards [len(prompts) * n])."""
    if getattr(task, "multi_turn", False):
        eps = run_episodes(engine, task, [p for p in prompts for _ in range(n)])
        return episodes_rollout(eps, pad_token_id=engine_pad_id(engine)), torch.tensor(
            [e.reward for e in eps], dtype=torch.float32)
    out = engine.generate([p.prompt_ids for p in prompts for _ in range(n)])
    rewards = [task.score(prompts[i // n], r) for i, r in enumerate(out.response_ids)]
    return out, torch.tensor(rewards, dtype=torch.float32)


def engine_pad_id(engine: Any) -> int:
    pad = getattr(engine, "pad_token_id", None)
    return pad if pad is not None else engine.engine.pad_token_id  # the vllm wrapper holds its engine


@dataclass
class Episode:
    """One sampled episode: its tokens after the prompt, which of them the model sampled, and the reward."""

    prompt: Prompt
    env: Any
    ids: list[int] = field(default_factory=list)
    """Tokens after the prompt: model turns and environment turns, in order."""
    model_mask: list[int] = field(default_factory=list)
    """1 where the model sampled the token, 0 on environment tokens."""
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-prob of each model token (0 on environment tokens)."""
    versions: list[int] = field(default_factory=list)
    """Weight version of each model turn."""
    replies: list[str] = field(default_factory=list)
    done: bool = False
    reward: float = 0.0

    def context(self) -> list[int]:
        return [*self.prompt.prompt_ids, *self.ids]

    def add(self, ids: list[int], *, model: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.model_mask += [int(model)] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)


def run_episodes(engine: Any, task: Any, prompts: list[Prompt]) -> list[Episode]:
    """One episode per prompt (repeat a prompt for a group), turn by turn, all live episodes per engine call."""
    eos = task.tokenizer.eos_token_id
    eps = [Episode(prompt=p, env=task.make_env()) for p in prompts]
    try:
        for e in eps:
            e.env.reset(e.prompt)
        for turn in range(task.max_turns):
            live = [e for e in eps if not e.done]
            if not live:
                break
            out = engine.generate([e.context() for e in live])
            for k, e in enumerate(live):
                resp = out.response_ids[k]
                lp = out.logprobs[k][out.response_mask[k].bool()].tolist()
                e.add(resp, model=True, logprobs=lp)
                e.versions.append(out.version)
                reply = decode_response(task.tokenizer, resp)
                e.replies.append(reply)
                step = e.env.step(reply)
                if step.done:
                    e.done, e.reward = True, float(step.reward)
                elif turn + 1 < task.max_turns:
                    e.add(env_turn_ids(task.tokenizer, step, reply_ended=bool(resp) and resp[-1] == eos,
                                       eos_token_id=eos), model=False)
        for e in eps:
            if not e.done:
                e.reward = float(e.env.finish())
    finally:
        for e in eps:
            e.env.close()
    return eps


def episodes_rollout(eps: list[Episode], *, pad_token_id: int) -> Rollout:
    """The episodes as one `Rollout`: prompt left-padded, then the episode's tokens, then right padding."""
    p = max(len(e.prompt.prompt_ids) for e in eps)
    t = p + max(len(e.ids) for e in eps)
    b = len(eps)
    ids = torch.full((b, t), pad_token_id, dtype=torch.long)
    attn = torch.zeros((b, t), dtype=torch.long)
    rmask = torch.zeros((b, t), dtype=torch.long)
    lps = torch.zeros((b, t), dtype=torch.float32)
    for i, e in enumerate(eps):
        n0, n1 = len(e.prompt.prompt_ids), len(e.ids)
        ids[i, p - n0:p + n1] = torch.tensor([*e.prompt.prompt_ids, *e.ids], dtype=torch.long)
        attn[i, p - n0:p + n1] = 1
        rmask[i, p:p + n1] = torch.tensor(e.model_mask, dtype=torch.long)
        lps[i, p:p + n1] = torch.tensor(e.logprobs, dtype=torch.float32)
    response_ids = [[x for x, m in zip(e.ids, e.model_mask) if m] for e in eps]
    return Rollout(input_ids=ids, attention_mask=attn, response_mask=rmask, logprobs=lps,
                   response_ids=response_ids, version=min(v for e in eps for v in e.versions))
