"""number_format: correctness first, partial credit for the format the prompt asks for."""
import pytest

from rlsync.rollout.rewards import Prompt, get_reward


@pytest.mark.parametrize("text,expected", [
    ("8", 1.0), (" 8.", 1.0),                 # just the right number
    ("8 is the answer", 0.7),                 # starts with the right number, more text
    ("9", 0.5),                               # just a number, wrong
    ("7 + 1 = 8", 0.2),                       # starts with a number (an operand): the format the model starts with
    ("The answer is 8.", 0.0), ("", 0.0),     # no number first
])
def test_number_format_scores(text, expected):
    p = Prompt(index=0, text="What is 7 + 1?", prompt_ids=[1], answer=8)
    assert get_reward("number_format")(p, [], text) == pytest.approx(expected)
