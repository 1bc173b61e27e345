"""Ecosystem tasks by config: a reasoning-gym generator scored by its own scorer, verifiers environments
(single- and multi-turn) scored by their rubric, and a bad name refused before anything starts."""

import pytest
import torch

from rlsync.core.errors import ConfigError
from rlsync.core.registry import UnknownNameError
from rlsync.rollout import RolloutEngine, TinyModelConfig, build_task, build_tiny_model, generate_scored
from rlsync.rollout.tasks import TASKS

SUMS = {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"], "allow_negation": False}


def test_a_reasoning_gym_generator_is_a_seeded_stream_scored_by_its_own_scorer():
    task = build_task("reasoning_gym", None, dataset="basic_arithmetic", dataset_args=SUMS, seed=1)
    again = build_task("reasoning_gym", None, dataset="basic_arithmetic", dataset_args=SUMS, seed=1)
    other = build_task("reasoning_gym", None, dataset="basic_arithmetic", dataset_args=SUMS, seed=2)
    ps = [task.prompt_at(i) for i in range(8)]
    assert [p.text for p in ps] == [again.prompt_at(i).text for i in range(8)]     # (seed, index) -> prompt
    assert [p.text for p in ps] != [other.prompt_at(i).text for i in range(8)]
    tok = task.tokenizer                                   # the tiny model's: one token per printable character
    p = ps[0]
    assert p.text.startswith("Calculate ") and p.prompt_ids[0] == tok.bos_token_id
    right = p.answer["answer"]
    assert task.score(p, tok.encode(right) + [tok.eos_token_id]) == 1.0
    assert task.score(p, tok.encode(f"so <answer>{right}</answer>")) == 1.0           # its answer tag is read
    assert 0.0 < task.score(p, tok.encode(f"= {right}")) < 1.0                      # the scorer's partial credit
    assert task.score(p, tok.encode("no idea")) == 0.0


def test_a_reasoning_gym_task_checks_its_dataset_and_reward_names_before_anything_starts():
    cls = TASKS.get("reasoning_gym")
    cls.check_args({"dataset": "chain_sum"})
    with pytest.raises(UnknownNameError, match="task.args.dataset: unknown reasoning-gym dataset 'chain_summ'; "
                                                "known: .*chain_sum"):
        cls.check_args({"dataset": "chain_summ"})
    with pytest.raises(UnknownNameError, match="task.args.reward: unknown reward 'exact'"):
        cls.check_args({"dataset": "chain_sum", "reward": "exact"})


def _play(task, prompt, replies):
    env = task.make_env()
    env.reset(prompt)
    steps = []
    for r in replies:
        steps.append(env.step(r))
        if steps[-1].done:
            break
    reward = steps[-1].reward if steps[-1].done else env.finish()
    env.close()
    return steps, reward


def test_a_verifiers_taskset_is_scored_by_its_rubric_after_one_reply():
    task = build_task("verifiers", None, env="rlsync_arithmetic", seed=0)
    p = task.prompt_at(3)
    answer = p.info["vf_task"].data.answer
    assert "What is" in p.text and task.multi_turn
    steps, reward = _play(task, p, [str(answer)])
    assert len(steps) == 1 and steps[0].done and reward == 1.0
    steps, reward = _play(task, p, [f"{answer} apples"])
    assert len(steps) == 1 and steps[0].done and reward == pytest.approx(0.7)   # right number first, not bare
    assert _play(task, p, ["I think 12"])[1] == 0.0


def test_a_multi_turn_verifiers_env_runs_its_own_loop_turn_by_turn():
    task = build_task("verifiers", None, env="rlsync_arithmetic_retry")
    p = task.prompt_at(0)
    answer = p.info["vf_task"].data.answer
    steps, reward = _play(task, p, ["no", str(answer)])
    assert not steps[0].done and "not just the right number" in steps[0].text and "What is" in steps[0].text
    assert steps[1].done and reward == pytest.approx(0.8)                      # right on the retry: 0.8
    assert _play(task, p, [str(answer)])[1] == 1.0
    # rlsync's turn budget ends the exchange: the env's interaction gets a terminated segment and scores.
    task1 = build_task("verifiers", None, env="rlsync_arithmetic_retry", max_turns=1)
    steps, reward = _play(task1, task1.prompt_at(0), ["no"])
    assert not steps[0].done and reward == 0.0


def test_a_verifiers_episode_trains_only_the_models_tokens():
    task = build_task("verifiers", None, env="rlsync_arithmetic_retry", max_response_tokens=3)
    tok = task.tokenizer
    m = build_tiny_model(TinyModelConfig(seed=0, max_position_embeddings=512), tok.vocab_size)
    engine = RolloutEngine(RolloutEngine.Config(max_new_tokens=3), m, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    out, rewards = generate_scored(engine, task, [task.prompt_at(0)], 2)
    env_text = tok.encode("That is not just the right number.")
    for i in range(2):
        ids = out.input_ids[i][out.attention_mask[i].bool()].tolist()
        mask = out.response_mask[i][out.attention_mask[i].bool()].tolist()
        start = next(k for k in range(len(ids)) if ids[k:k + len(env_text)] == env_text)   # the env's turn
        assert not any(mask[start:start + len(env_text)])
        assert sum(mask) == len(out.response_ids[i]) == 6                       # 2 turns x 3 sampled tokens
    assert rewards.tolist() == [0.0, 0.0]                                       # a random model: no number


def test_verifiers_names_a_missing_or_unloadable_environment():
    cls = TASKS.get("verifiers")
    cls.check_args({"env": "rlsync_arithmetic"})
    with pytest.raises(ConfigError, match="task.args.env: .*no_such_env"):
        cls.check_args({"env": "no_such_env"})
    with pytest.raises(ConfigError, match="task.args.env: set task.args.env"):
        cls.check_args({})
