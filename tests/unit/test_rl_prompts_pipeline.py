"""RL prompt files go through the data pipeline of offline data: mixing by weight, hold-out, row
formats per dataset, invalid-row skipping; prompts are fitted into data.max_length by data.truncation;
settings RL cannot use are refused when the config loads."""

from __future__ import annotations

import re

import pytest

from oxrl.config.load import ConfigError, load_config
from oxrl.data.errors import DataError
from oxrl.data.rl_prompts import load_rl_prompts
from oxrl.data.rl_tasks import RLPrompt, encode_prompts
from oxrl.loops.rl_setup import reward_function
from tests.unit.test_data_read import write_jsonl
from tests.integration.test_data_tokenize import char_tokenizer

# The char tokenizer's ChatML render of one user message, <|im_start|> "user\n" CONTENT <|im_end|> "\n"
# <|im_start|> "assistant\n", is len(CONTENT) + 19 tokens (one per character, one per special token).
CHAT_OVERHEAD = 1 + len("user\n") + 1 + len("\n") + 1 + len("assistant\n")


def gsm8k_rows(n: int, prefix: str = "q") -> list[dict]:
    return [{"question": f"{prefix}{i}?", "answer": f"so\n#### {i}"} for i in range(n)]


def config(*overrides: str):
    return load_config(None, ["model.name_or_path=m", "algorithm.name=grpo", *overrides])


def loaded(*overrides: str, seed: int = 0):
    cfg = config(*overrides, f"run.seed={seed}")
    return load_rl_prompts(cfg.data, cfg.rl, seed=cfg.run.seed)


def test_the_run_picks_a_task_or_files_and_the_file_reader_reads_files_only():
    from oxrl.data.rl_tasks import task_prompts
    from oxrl.loops.rl_setup import load_prompts

    cfg = config("rl.task=arithmetic", "rl.task_size=6", "rl.validation_size=2")
    train, validation = load_prompts(cfg, cfg.rl)
    assert (train, validation) == task_prompts(cfg.rl, cfg.run.seed) and (len(train), len(validation)) == (6, 2)
    with pytest.raises(ValueError, match="rl.task 'arithmetic' generates its own prompts"):
        load_rl_prompts(cfg.data, cfg.rl, seed=0)


def test_two_files_are_mixed_by_weight_deterministically_keeping_origin_and_fields(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", gsm8k_rows(10, "a"))
    b = write_jsonl(tmp_path / "b.jsonl", gsm8k_rows(10, "b"))
    settings = [f"data.train=[{{path: {a}, weight: 3}}, {{path: {b}, weight: 1}}]", "data.num_examples=40",
                "rl.validation_size=0"]
    prompts = loaded(*settings)
    assert prompts.counts == {"a.jsonl": 30, "b.jsonl": 10} and len(prompts.train) == 40
    assert sum(p.source == str(a) for p in prompts.train) == 30  # 3 passes over a, 1 over b
    first = next(p for p in prompts.train if p.source == str(b))
    assert first.origin == f"{b} row 1" and first.fields["answer"] == "0"
    assert first.messages[-1]["content"].startswith("b0?")
    again, other = loaded(*settings), loaded(*settings, "data.num_examples=30", seed=1)
    assert [p.origin for p in again.train] == [p.origin for p in prompts.train]
    assert other.counts == {"a.jsonl": 23, "b.jsonl": 7}  # 22.5 and 7.5: the tied remainder goes to the first
    a_rows = [p.row for p in other.train if p.source == str(a)]
    assert a_rows[:20] == list(range(1, 11)) * 2 and len(set(a_rows[20:])) == 3  # 2 passes, then 3 rows sampled


def test_columns_format_and_max_rows_apply_per_dataset(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"query": f"What is {i}+1?", "gold": str(i + 1)} for i in range(5)])
    prompts = loaded(f"data.train=[{{path: {path}, format: rl2, columns: {{query: prompt, gold: answer}}, "
                     "max_rows: 3}]", "rl.validation_size=0")
    assert [(p.prompt, p.fields) for p in prompts.train] == [(f"What is {i}+1?", {"answer": str(i + 1)}) for i in range(3)]
    with pytest.raises(DataError, match="field 'answer': expected GSM8K's final"):
        loaded(f"data.train=[{{path: {path}, format: gsm8k, columns: {{query: question, gold: answer}}}}]")


def test_chat_template_false_renders_the_prompt_as_plain_text(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(1))
    (chat,) = loaded(f"data.train=[{{path: {path}}}]").train
    (plain,) = loaded(f"data.train=[{{path: {path}, chat_template: false}}]", "rl.system_prompt=Be brief.").train
    assert chat.messages is not None and plain.messages is None
    assert plain.prompt == "Be brief.\n" + chat.messages[-1]["content"]  # system, then the question and instruction
    tokenizer = char_tokenizer()
    batch = encode_prompts([plain], tokenizer)
    assert batch.prompt_ids == [tokenizer(plain.prompt)["input_ids"]] and batch.prompt_texts == [plain.prompt]
    assert len(encode_prompts([chat], tokenizer).prompt_ids[0]) == len(chat.messages[-1]["content"]) + CHAT_OVERHEAD


def test_validation_fraction_holds_out_part_of_each_file_before_mixing(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", gsm8k_rows(10, "a"))
    b = write_jsonl(tmp_path / "b.jsonl", gsm8k_rows(20, "b"))
    settings = [f"data.train=[{{path: {a}}}, {{path: {b}}}]", "data.validation_fraction=0.2"]
    prompts = loaded(*settings)
    held = [p.origin for p in prompts.validation]
    assert sum(o.startswith(str(a)) for o in held) == 2 and sum(o.startswith(str(b)) for o in held) == 4
    assert not set(held) & {p.origin for p in prompts.train} and len(prompts.train) == 24
    assert [p.origin for p in loaded(*settings).validation] == held
    assert [p.origin for p in loaded(*settings, seed=1).validation] != held


def test_validation_files_and_the_first_rows_split_still_work(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", gsm8k_rows(8))
    val = write_jsonl(tmp_path / "val.jsonl", gsm8k_rows(2, "v"))
    prompts = loaded(f"data.train=[{{path: {train}}}]", f"data.validation=[{{path: {val}}}]")
    assert len(prompts.train) == 8 and [p.source for p in prompts.validation] == [str(val)] * 2
    split = loaded(f"data.train=[{{path: {train}, weight: 1}}]", "rl.validation_size=3")
    assert [p.row for p in split.validation] == [1, 2, 3] and [p.row for p in split.train] == [4, 5, 6, 7, 8]


def test_invalid_rows_are_skipped_and_counted_when_asked(tmp_path):
    rows = gsm8k_rows(4)
    rows[2]["answer"] = "no final line"
    path = write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    with pytest.raises(DataError, match=re.escape(f"{path}, row 3, field 'answer': expected GSM8K's final")):
        loaded(f"data.train=[{{path: {path}}}]")
    prompts = loaded(f"data.train=[{{path: {path}}}]", "data.skip_invalid_rows=true")
    assert [p.row for p in prompts.train] == [1, 2, 4] and prompts.skipped == {"invalid_row": 1}


# ---------------------------------------------------------------------------------------------
# Truncation: a budget of data.max_length - rl.rollout.max_new_tokens prompt tokens


def chat_prompt(content: str, system: str | None = None) -> RLPrompt:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return RLPrompt(messages=messages, fields={"answer": "1"}, source="p.jsonl", row=7, column="question")


def test_left_cuts_the_start_of_the_user_message_and_keeps_the_chat_whole(oxrl_log):
    tokenizer = char_tokenizer()
    short, long = chat_prompt("0123"), chat_prompt("abcdefghijklmnopqrstuvwxyz")
    budget = CHAT_OVERHEAD + 10
    batch = encode_prompts([short, long], tokenizer, max_tokens=budget, truncation="left")
    assert batch.prompt_texts == ["0123", "qrstuvwxyz"] and len(batch.prompt_ids[1]) == budget
    rendered = "".join(tokenizer.convert_ids_to_tokens(batch.prompt_ids[1]))
    assert rendered == "<|im_start|>user\nqrstuvwxyz<|im_end|>\n<|im_start|>assistant\n"
    assert batch.origins == ["p.jsonl row 7"] * 2 and "cut the start of 1 of 2 prompts" in oxrl_log.text


def test_left_cuts_plain_text_prompts_from_their_start():
    tokenizer = char_tokenizer()
    prompt = RLPrompt(prompt="Long context. Question: 2+2?", source="p.jsonl", row=1)
    (ids,) = encode_prompts([prompt], tokenizer, max_tokens=10, truncation="left").prompt_ids
    assert "".join(tokenizer.convert_ids_to_tokens(ids)) == "tion: 2+2?"


def test_left_refuses_a_prompt_whose_system_prompt_leaves_no_room():
    with pytest.raises(DataError, match=r"^p.jsonl, row 7, field 'question': .* leave no room"):
        encode_prompts([chat_prompt("abc", system="x" * 40)], char_tokenizer(), max_tokens=CHAT_OVERHEAD + 2,
                       truncation="left")


def test_drop_leaves_long_prompts_out_and_counts_them(oxrl_log):
    prompts = [chat_prompt("short"), chat_prompt("much too long for the budget")]
    batch = encode_prompts(prompts, char_tokenizer(), max_tokens=CHAT_OVERHEAD + 5, truncation="drop")
    assert batch.prompt_texts == ["short"] and "dropped 1 of 2 prompts longer than 24 tokens" in oxrl_log.text
    with pytest.raises(ValueError, match="every prompt is longer than 21 tokens"):
        encode_prompts(prompts, char_tokenizer(), max_tokens=CHAT_OVERHEAD + 2, truncation="drop")


@pytest.mark.parametrize("truncation, advice", [
    ("error", "set data.truncation to left"),
    ("right", "data.truncation `right` (the default) does not apply to RL prompts"),
])
def test_error_and_right_stop_at_a_long_prompt_naming_file_row_and_field(truncation, advice):
    budget = CHAT_OVERHEAD + 5
    message = f"p.jsonl, row 7, field 'question': {budget + 3} tokens, more than the {budget} that data.max_length"
    with pytest.raises(DataError, match=re.escape(message) + ".*" + re.escape(advice)):
        encode_prompts([chat_prompt("12345678")], char_tokenizer(), max_tokens=budget, truncation=truncation)
    assert encode_prompts([chat_prompt("12345")], char_tokenizer(), max_tokens=budget, truncation=truncation).prompt_texts


def test_the_budget_comes_from_the_config(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_rows(1, "What is one plus one, in words? "))
    cfg = config(f"data.train=[{{path: {path}}}]", "data.max_length=60", "rl.rollout.max_new_tokens=20",
                 "data.truncation=error")
    prompts = load_rl_prompts(cfg.data, cfg.rl, seed=0).train
    with pytest.raises(DataError, match=rf"^{path}, row 1, field 'question': \d+ tokens, more than the 40"):
        encode_prompts(prompts, char_tokenizer(), max_tokens=cfg.data.max_length - cfg.rl.rollout.max_new_tokens,
                       truncation=cfg.data.truncation)


# ---------------------------------------------------------------------------------------------
# Refusals, when the config loads


@pytest.mark.parametrize("overrides, message", [
    (["train.eval_every=5"], "train.eval_every = 5 is not read by `grpo`: it is read only by offline objectives; .*use rl.validation_every"),
    (["data.max_length=256"], r"data.max_length \(256\) must exceed rl.rollout.max_new_tokens \(256\)"),
    (["data.train=[{path: a.jsonl}]", "data.validation_fraction=0.1", "rl.validation_size=5"],
     r"data.validation_fraction \(0.1\) and rl.validation_size \(5\) both hold out prompts"),
    (["data.train=[{path: a.jsonl, format: preference}]"],
     r"data.train\[0\].format `preference` is not an RL prompt format: RL reads gsm8k, openr1, rl2 rows"),
    (["data.validation=[{path: a.jsonl, format: messages}]"], r"data.validation\[0\].format `messages` is not an RL"),
    (["rl.data_format=rl2"], "`rl.data_format` was replaced by each dataset's `format`: set `format: rl2`"),
])
def test_settings_rl_cannot_use_are_refused_with_what_to_use(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(*overrides)


def test_offline_objectives_refuse_rl_formats_and_old_configs_still_load():
    with pytest.raises(ConfigError, match=r"data.train\[0\].format `gsm8k` is an RL prompt format, and `sft` trains on "
                                          "offline rows: use one of messages, prompt_response, text, preference, kto"):
        load_config(None, ["model.name_or_path=m", "algorithm.name=sft", "data.train=[{path: a.jsonl, format: gsm8k}]"])
    assert config("rl.data_format=auto", "rl.task=arithmetic").rl.task == "arithmetic"  # an earlier run's config.yaml


def test_declared_rl2_rows_have_no_default_reward():
    cfg = config("data.train=[{path: a.jsonl, format: rl2}]")
    with pytest.raises(ValueError, match="task 'rl2' has no default reward: name one in `rl.rewards`"):
        reward_function(cfg, cfg.rl)
    assert reward_function(config("data.train=[{path: a.jsonl}]"), cfg.rl) is not None  # auto: math
