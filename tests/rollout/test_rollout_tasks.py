"""Tasks: deterministic, resumable prompt streams and their verifiers."""

import pytest

from rlsync.rollout import CharTokenizer, Prompt, build_task, get_reward, get_task, register_reward
from rlsync.trainer import UnknownNameError


def test_reverse_and_successor_prompts_and_answers():
    tok = CharTokenizer("abcdefghijkl")
    assert tok.vocab_size == 16
    p = build_task("reverse", seed=0).prompt_at(0)
    assert p.prompt_ids[0] == tok.bos_token_id and p.prompt_ids[-1] == tok.sep_token_id
    assert tok.decode(p.prompt_ids[1:-1]) == p.text and len(p.text) == 3
    assert tok.decode(p.answer) == p.text[::-1] and p.answer[-1] == tok.eos_token_id
    s = build_task("successor", seed=0).prompt_at(0)
    assert tok.decode(s.answer) == "".join("abcdefghijkl"[("abcdefghijkl".index(c) + 1) % 12] for c in s.text)
    assert build_task("successor", symbols="xyz", length=2).prompt_at(5).answer[-1] == 2


def test_stream_is_seeded_and_resumes_from_the_cursor():
    a = build_task("reverse", seed=3)
    first = a.next_prompts(10)
    b = build_task("reverse", seed=3)
    b.load_state_dict(a.state_dict())
    assert a.state_dict()["cursor"] == 10
    assert [p.text for p in b.next_prompts(5)] == [p.text for p in a.next_prompts(5)]
    fresh = build_task("reverse", seed=3).next_prompts(15)
    assert [p.text for p in fresh[:10]] == [p.text for p in first]
    assert [p.index for p in fresh] == list(range(15))
    assert [p.text for p in build_task("reverse", seed=4).next_prompts(10)] != [p.text for p in first]
    with pytest.raises(ValueError, match="seed"):
        build_task("reverse", seed=5).load_state_dict(a.state_dict())


def test_partial_credit_reward():
    task = build_task("reverse", seed=0)
    p = task.prompt_at(0)
    assert task.score(p, p.answer) == 1.0
    assert task.score(p, p.answer[:2] + [p.answer[0] ^ 1 if p.answer[0] > 3 else 4, 2]) == 0.75
    assert task.score(p, [p.answer[0]]) == 0.25  # short response: missing positions are wrong
    assert task.score(p, []) == 0.0


def test_number_match_reward_and_registry():
    p = Prompt(index=0, text="What is 3 + 4?", prompt_ids=[1], answer=7)
    f = get_reward("number_match")
    assert f(p, [], "The answer is 7.") == 1.0
    assert f(p, [], "17") == 0.0 and f(p, [], "seven") == 0.0
    assert f(Prompt(index=0, text="", prompt_ids=[1], answer=-3), [], " -3") == 1.0

    @register_reward("test_always_half")
    def half(prompt, ids, text):
        return 0.5

    assert build_task("reverse", reward="test_always_half").score(p, [1]) == 0.5
    with pytest.raises(UnknownNameError, match="partial_match"):
        get_reward("nope")
    with pytest.raises(KeyError, match="arithmetic, arithmetic_retry, reasoning_gym, reverse, successor, verifiers"):
        get_task("sort")


class FakeChatTokenizer:
    """The slice of a HF tokenizer the arithmetic task uses."""

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return f"<user>{messages[0]['content']}<assistant>"

    def __call__(self, text, add_special_tokens):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_arithmetic_task():
    task = build_task("arithmetic", tokenizer=FakeChatTokenizer(), seed=1, max_operand=9)
    p = task.next_prompts(1)[0]
    a, op, b = p.text.split("What is ")[1].split("?")[0].split()
    assert p.answer == (int(a) + int(b) if op == "+" else int(a) - int(b))
    assert p.text.startswith("<user>") and p.prompt_ids[:6] == [ord(c) for c in "<user>"]
    assert task.score(p, [ord(c) for c in str(p.answer)]) == 1.0
    assert task.score(p, [ord(c) for c in str(p.answer + 1)]) == 0.0
    with pytest.raises(ValueError, match="tokenizer"):
        build_task("arithmetic")
