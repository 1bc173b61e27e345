"""Multi-turn episodes: only the model's tokens are in the loss mask, their behaviour log-probs are the ones
the trainer computes on the whole episode, and the environment's turns are context in between."""

import copy

import torch

from rlsync.core.batch import Batch
from rlsync.rollout import Environment, EnvStep, RolloutEngine, generate_scored
from rlsync.rollout.tasks import ReverseTask
from rlsync.trainer import token_logprobs


class TwoTurnEnv(Environment):
    """Answers the first reply with "ab", ends the episode after the second with a reward of its length."""

    def __init__(self):
        self.replies = []

    def step(self, reply):
        self.replies.append(reply)
        if len(self.replies) == 1:
            return EnvStep(text="ab")
        return EnvStep(done=True, reward=len(reply) / 10)


class TwoTurnReverse(ReverseTask):
    multi_turn = True
    max_turns = 3  # the env ends every episode after 2 replies

    def make_env(self):
        return TwoTurnEnv()


class SpyEngine:
    """The real HF engine, keeping what each `generate` call sampled (to know which tokens the model wrote)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []
        self.pad_token_id = engine.pad_token_id

    def generate(self, prompts):
        out = self.engine.generate(prompts)
        self.calls.append([list(r) for r in out.response_ids])
        return out


def test_only_model_tokens_are_trained_and_their_logprobs_match_the_trainers(tiny):
    _, model = tiny
    task = TwoTurnReverse(TwoTurnReverse.Config(seed=3))
    tok = task.tokenizer
    torch.manual_seed(0)
    engine = SpyEngine(RolloutEngine(RolloutEngine.Config(max_new_tokens=4), copy.deepcopy(model),
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    prompts = task.next_prompts(3)
    out, rewards = generate_scored(engine, task, prompts, 2)

    assert len(engine.calls) == 2 and rewards.shape == (6,)          # two model turns per episode, 6 episodes
    env_ids = tok.encode("ab") + [tok.sep_token_id]
    for i in range(6):
        r1, r2 = engine.calls[0][i], engine.calls[1][i]
        ended = bool(r1) and r1[-1] == tok.eos_token_id
        env = ([] if ended else [tok.eos_token_id]) + env_ids         # a cut-off reply is closed by the env turn
        prompt = prompts[i // 2].prompt_ids
        real = out.attention_mask[i].bool()
        assert out.input_ids[i][real].tolist() == prompt + r1 + env + r2
        want_mask = [0] * len(prompt) + [1] * len(r1) + [0] * len(env) + [1] * len(r2)
        assert out.response_mask[i][real].tolist() == want_mask       # the env's tokens are not trained
        assert out.response_ids[i] == r1 + r2
        assert rewards[i] == len(tok.decode(r2)) / 10
    assert (out.logprobs[~out.response_mask.bool()] == 0).all()
    assert (out.response_mask.bool() <= out.attention_mask.bool()).all()

    # The trainer re-scores each whole episode (env turns included as context): same log-probs per model token.
    with torch.no_grad():
        lp, _ = token_logprobs(engine.engine.model, out.input_ids, out.attention_mask)
    m = out.response_mask.bool()
    assert torch.allclose(lp[m], out.logprobs[m], atol=1e-4), (lp[m] - out.logprobs[m]).abs().max()
    batch = out.to_batch(rewards, torch.arange(3).repeat_interleave(2))
    assert isinstance(batch, Batch) and int(batch.response_mask.sum()) == sum(len(r) for r in out.response_ids)


def test_single_turn_tasks_are_one_generate_call(tiny):
    task, model = tiny
    tok = task.tokenizer
    engine = SpyEngine(RolloutEngine(RolloutEngine.Config(max_new_tokens=4), copy.deepcopy(model),
                                     pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
    prompts = task.next_prompts(2)
    out, rewards = generate_scored(engine, task, prompts, 3)
    assert len(engine.calls) == 1 and out.input_ids.shape[0] == 6
    assert rewards.tolist() == [task.score(prompts[i // 3], r) for i, r in enumerate(out.response_ids)]
