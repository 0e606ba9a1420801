"""RL prompts: files (GSM8K, OpenR1, RL2) with located errors, generated tasks with disjoint splits, default rewards."""

from __future__ import annotations

import json
import re

import pytest

from oxrl.data.errors import DataError
from oxrl.data.rl_prompts import read_rl_prompts
from oxrl.data.rl_tasks import PromptTemplate, RLPrompt, default_rewards, generate_rl_prompts
from oxrl.rewards import build_reward_fn


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def questions(prompts: list[RLPrompt]) -> list[str]:
    return [p.messages[-1]["content"] for p in prompts]


def test_arithmetic_is_deterministic_disjoint_and_correct():
    train, validation = generate_rl_prompts("arithmetic", train_size=300, validation_size=50, seed=3)
    again, _ = generate_rl_prompts("arithmetic", train_size=300, validation_size=50, seed=3)
    other, _ = generate_rl_prompts("arithmetic", train_size=300, validation_size=50, seed=4)
    assert questions(train) == questions(again) and questions(train) != questions(other)
    assert len(set(questions(train))) == 300 and not set(questions(train)) & set(questions(validation))
    for prompt in train + validation:
        expression = prompt.messages[-1]["content"].split("?")[0].removeprefix("What is ")
        assert prompt.fields["answer"] == str(eval(expression))  # noqa: S307 - our own "a+b" strings
        assert "\\boxed{}" in prompt.messages[-1]["content"]
    assert (train[0].source, train[0].row, validation[0].row) == ("arithmetic", 1, 1)


def test_arithmetic_is_scored_by_its_default_math_reward():
    train, _ = generate_rl_prompts("arithmetic", train_size=4, validation_size=0, seed=0)
    reward_fn = build_reward_fn([s.model_dump() for s in default_rewards("arithmetic")])
    right = [f"The answer is \\boxed{{{p.fields['answer']}}}." for p in train]
    wrong = [f"\\boxed{{{int(p.fields['answer']) + 1}}}" for p in train]
    prompts = [p.messages[-1]["content"] for p in train] * 2
    out = reward_fn(prompts, right + wrong, [p.fields for p in train] * 2, [p.origin for p in train] * 2)
    assert out.totals == [1.0] * 4 + [0.0] * 4


def test_arithmetic_space_too_small_and_unknown_task():
    with pytest.raises(ValueError, match="only 7 distinct questions"):
        generate_rl_prompts("arithmetic", train_size=6, validation_size=2, max_operand=1)
    with pytest.raises(ValueError, match="unknown generated task"):
        generate_rl_prompts("no_such_task", train_size=1, validation_size=1)
    with pytest.raises(ValueError, match="no default reward"):
        default_rewards("rl2")


def test_templates_tags_and_system_prompt():
    template = PromptTemplate(answer_format="tags", system="You are a careful calculator.")
    train, _ = generate_rl_prompts("arithmetic", train_size=1, validation_size=0, template=template)
    system, user = train[0].messages
    assert system == {"role": "system", "content": "You are a careful calculator."}
    assert "<answer>" in user["content"] and "<think>" in user["content"]
    (spec,) = default_rewards("arithmetic", answer_format="tags")
    assert spec.kwargs == {"prefer": "tag"}
    with pytest.raises(ValueError, match="answer_format"):
        PromptTemplate(answer_format="xml")


@pytest.mark.parametrize("task", ["basic_arithmetic", "chain_sum", "countdown"])
def test_reasoning_gym_splits_are_disjoint_deterministic_and_scored(task):
    pytest.importorskip("reasoning_gym")
    train, validation = generate_rl_prompts(task, train_size=20, validation_size=8, seed=0)
    again, _ = generate_rl_prompts(task, train_size=20, validation_size=8, seed=0)
    assert questions(train) == questions(again)
    assert len(validation) == 8 and not {p.fields["question"] for p in train} & {p.fields["question"] for p in validation}
    assert train[0].source == f"reasoning_gym/{task}" and train[0].fields["metadata"]["source_dataset"] == task
    reward_fn = build_reward_fn([s.model_dump() for s in default_rewards(task)])
    golds = [f"<answer>{p.fields['answer']}</answer>" for p in validation]
    out = reward_fn(["p"] * len(validation), golds, [p.fields for p in validation])
    assert out.totals == [1.0] * len(validation)


def test_reasoning_gym_small_space_is_an_error():
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ValueError, match="too small"):
        generate_rl_prompts("chain_sum", train_size=1000, validation_size=5, min_terms=2, max_terms=2, max_digits=1)


def test_gsm8k_jsonl(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", [
        {"question": "Tom has 2 apples and buys 40. How many?", "answer": "2 + 40 = 42\n#### 42", "id": "a"},
        {"question": "How many?", "answer": "...\n#### 1,000"},
    ])
    first, second = read_rl_prompts(path)
    assert first.fields == {"answer": "42", "solution": "2 + 40 = 42\n#### 42", "id": "a"}
    assert first.messages[-1]["content"].startswith("Tom has 2 apples") and (first.source, first.row) == (path, 1)
    assert second.fields["answer"] == "1000" and second.row == 2


def test_gsm8k_csv_and_saved_dataset_folder(tmp_path):
    from datasets import Dataset

    csv_path = tmp_path / "gsm8k.csv"
    csv_path.write_text('question,answer\n"What is 1+1?","1+1=2\n#### 2"\n')
    assert read_rl_prompts(str(csv_path))[0].fields["answer"] == "2"
    folder = tmp_path / "saved"
    Dataset.from_list([{"problem": "Find x.", "solution": "so x = \\boxed{\\frac{1}{2}}"}]).save_to_disk(str(folder))
    (prompt,) = read_rl_prompts(str(folder))
    assert prompt.fields["answer"] == "\\frac{1}{2}"


def test_openr1_parquet_gold_from_the_last_box(tmp_path):
    from datasets import Dataset

    path = str(tmp_path / "openr1.parquet")
    Dataset.from_list([
        {"problem": "P1", "solution": "first \\boxed{1}, finally \\boxed{x^{2}}", "answer": "ignored"},
        {"problem": "P2", "solution": "no box", "answer": "7"},
    ]).to_parquet(path)
    first, second = read_rl_prompts(path, max_rows=2)
    assert first.fields["answer"] == "x^{2}" and second.fields["answer"] == "7"
    reward_fn = build_reward_fn([s.model_dump() for s in default_rewards("openr1")])
    assert reward_fn(["P1"], ["\\boxed{x^2}"], [first.fields]).totals == [1.0]


def test_rl2_prompt_messages_and_extra_info(tmp_path):
    path = write_jsonl(tmp_path / "rl2.jsonl", [
        {"prompt": "Say hi", "extra_info": {"answer": "hi"}},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
         "extra_info": {"answer": "4", "tests": ["assert True"]}},
    ])
    first, second = read_rl_prompts(path)
    assert first.prompt == "Say hi" and first.messages is None and first.fields == {"answer": "hi"}
    assert second.messages[0]["role"] == "system" and second.fields == {"answer": "4", "tests": ["assert True"]}
    verl = write_jsonl(tmp_path / "verl.jsonl", [{"prompt": [{"role": "user", "content": "Hi"}], "extra_info": None}])
    assert read_rl_prompts(verl, format="rl2")[0].messages == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    "rows, message",
    [
        ([{"question": "q", "answer": "#### 1"}, {"question": "q", "answer": None}],
         "gsm8k.jsonl, row 2, field 'answer': expected a string, got null"),
        ([{"question": "q", "answer": "no final line"}], "row 1, field 'answer': expected GSM8K's final '#### <answer>'"),
        ([{"question": "", "answer": "#### 1"}], "row 1, field 'question': empty string"),
        ([{"problem": "p", "solution": "no box"}], "row 1, field 'solution': no \\boxed{} answer"),
        ([{"messages": [{"role": "robot", "content": "x"}]}], "row 1, field 'messages[0].role': unknown role 'robot'"),
        ([{"prompt": "x", "extra_info": [1]}], "row 1, field 'extra_info': expected an object, got a list"),
        ([{"text": "x"}], "cannot tell the RL prompt format"),
    ],
)
def test_malformed_rows_name_file_row_and_field(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    with pytest.raises(DataError, match=re.escape(message)):
        read_rl_prompts(path)


def test_broken_json_line_is_located(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n')
    with pytest.raises(DataError, match="row 2"):
        read_rl_prompts(str(path))


def test_plain_question_answer_rows_via_a_column_rename(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "What is 2+2?", "answer": "4"}])
    with pytest.raises(DataError, match="rename `question` to `prompt`"):
        read_rl_prompts(path)
    (prompt,) = read_rl_prompts(path, columns={"question": "prompt"})
    assert prompt.prompt == "What is 2+2?" and prompt.fields == {"answer": "4"}


@pytest.mark.parametrize("name, content", [("empty.jsonl", ""), ("header.csv", "question,answer\n")])
def test_an_empty_prompt_file_is_a_data_error_naming_it(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=f"{re.escape(str(path))}: the file is empty: no rows"):
        read_rl_prompts(str(path))


def test_bad_task_options_and_names_get_suggestions():
    with pytest.raises(ValueError, match="rl.task_config: task 'arithmetic' has no option 'max_operan'. Did you mean "
                                         "'max_operand'\\? Its options: max_operand"):
        generate_rl_prompts("arithmetic", train_size=2, validation_size=0, max_operan=5)
    with pytest.raises(ValueError, match="unknown generated task 'arithmetc'. Did you mean 'arithmetic'\\?"):
        generate_rl_prompts("arithmetc", train_size=2, validation_size=0)


def test_bad_reasoning_gym_options_are_named():
    pytest.importorskip("reasoning_gym")
    with pytest.raises(ValueError, match="task 'chain_sum' has no option 'min_term'. Did you mean 'min_terms'\\?"):
        generate_rl_prompts("chain_sum", train_size=2, validation_size=0, min_term=2)
    with pytest.raises(ValueError, match="is not valid for reasoning-gym 'chain_sum': max_terms must be >= min_terms"):
        generate_rl_prompts("chain_sum", train_size=2, validation_size=0, min_terms=5, max_terms=2)
    with pytest.raises(ValueError, match="unknown generated task 'chainsum'. Did you mean 'chain_sum'\\?"):
        generate_rl_prompts("chainsum", train_size=2, validation_size=0)
