"""Built-in rewards: answer extraction, math (math-verify), format, reasoning-gym, code (happy paths)."""

from __future__ import annotations

import threading

import pytest

from oxrl.rewards.code_reward import code_reward, parse_tests
from oxrl.data.code_blocks import extract_code
from oxrl.data.extract import final_answer, last_boxed, last_number, tag_content
from oxrl.rewards.format_reward import format_reward
from oxrl.rewards.math_reward import math_reward


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}} and later \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),  # nested braces, the last box
        ("\\boxed{1} then a cut-off \\boxed{\\frac{1", "1"),  # unclosed box: fall back to the one before
        ("\\boxed 5.", "5"),
        ("\\fbox{7}", "7"),
        ("no box here", None),
        ("\\boxed{}", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_number_and_tags():
    assert last_number("12 + 7 = 19.") == "19"
    assert last_number("a total of 1,000 apples") == "1000"
    assert last_number("5-3=2") == "2"
    assert last_number("it is -4") == "-4"
    assert last_number("12-7") == "7"  # binary minus, not a negative number
    assert last_number("nothing") is None
    assert tag_content("<answer> 1 </answer><answer>2</answer>", "answer") == "2"
    assert tag_content("<answer> </answer>", "answer") is None


def test_final_answer_order():
    text = "<think>maybe \\boxed{3}</think><answer>4</answer>"
    assert final_answer(text) == "3"  # boxed first by default
    assert final_answer(text, prefer="tag") == "4"
    assert final_answer("the answer is 12") == "12"


def test_extract_code_prefers_python_blocks_and_ignores_unclosed():
    text = "```bash\nls\n```\n```python\nprint(1)\n```\n```\nprint(2)\n```"
    assert extract_code(text) == "print(1)\n"
    assert extract_code("```\nprint(2)\n```") == "print(2)\n"
    assert extract_code("```python\nprint(1)") is None


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("12+7 = \\boxed{19}", "19", 1.0),
        ("so the answer is 19.", "19", 1.0),  # no box: the final number
        ("\\boxed{18}", "19", 0.0),
        ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("<answer>x^2+1</answer>", "1+x^2", 1.0),
        ("I do not know", "19", 0.0),
        ("\\boxed{19}", 19, 1.0),  # a numeric gold answer
    ],
)
def test_math_reward(completion, answer, expected):
    assert math_reward("p", completion, answer=answer) == expected


def test_math_reward_rejects_bad_gold_answers():
    with pytest.raises(ValueError, match="empty"):
        math_reward("p", "\\boxed{1}", answer=" ")
    with pytest.raises(ValueError, match="string or a number"):
        math_reward("p", "\\boxed{1}", answer=None)


def test_math_reward_works_outside_the_main_thread():
    # math-verify's signal-based timeouts raise there; math_reward turns them off (documented).
    results = []
    worker = threading.Thread(target=lambda: results.append(math_reward("p", "\\boxed{\\frac{2}{4}}", answer="1/2")))
    worker.start()
    worker.join()
    assert results == [1.0]


def test_format_reward():
    assert format_reward("p", "<think>a</think>\n<answer>b</answer>") == 1.0
    assert format_reward("p", "<answer>b</answer>") == 0.0
    assert format_reward("p", "<think>a</think><answer>b</answer> trailing") == 0.0
    assert format_reward("p", "<think>a</think><answer>b</answer><answer>c</answer>") == 0.0
    assert format_reward("p", "<answer>b</answer>", think_tag=None) == 1.0
    assert format_reward("p", "<reasoning>a</reasoning><final>b</final>", think_tag="reasoning", answer_tag="final") == 1.0
    assert format_reward("p", "ANSWER: 4", pattern=r"ANSWER: \d+") == 1.0


def test_reasoning_gym_reward_uses_the_task_scorer():
    pytest.importorskip("reasoning_gym")
    from oxrl.data.rl_tasks import generate_rl_prompts
    from oxrl.rewards.gym_reward import reasoning_gym_reward

    train, _ = generate_rl_prompts("chain_sum", train_size=3, validation_size=0, seed=0)
    fields = train[0].fields
    gold = fields["answer"]
    assert reasoning_gym_reward("p", f"<answer>{gold}</answer>", **fields) == 1.0
    assert reasoning_gym_reward("p", f"so \\boxed{{{gold}}}", **fields) == 1.0
    assert reasoning_gym_reward("p", "<answer>nonsense</answer>", **fields) == 0.0


def test_code_reward_stdin_stdout_and_asserts():
    program = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    io_tests = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "8\n"]}  # the second expectation is wrong
    functions = "```python\ndef add(a, b):\n    return a + b\n```"
    asserts = ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]
    scores = code_reward(["p"] * 3, [program, functions, "no code"], tests=[io_tests, asserts, asserts])
    assert scores == [0.5, 0.5, 0.0]


def test_parse_tests_formats():
    assert len(parse_tests('{"inputs": ["1"], "outputs": ["1"]}')) == 1
    assert parse_tests([{"input": ["1", "2"], "output": "3"}])[0].stdin == "1\n2\n"
    with pytest.raises(ValueError, match="empty"):
        parse_tests([])
    with pytest.raises(ValueError, match="same length"):
        parse_tests({"inputs": ["1"], "outputs": []})
    with pytest.raises(ValueError, match="must be"):
        parse_tests(42)
