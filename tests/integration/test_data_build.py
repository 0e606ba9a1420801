"""`load_examples`: everything validated up front, skip mode counts, hold-out, mixing, the bundled set."""

from __future__ import annotations

import pytest

from oxrl.config.schema import DataConfig
from oxrl.data.build import load_examples
from oxrl.data.errors import DataError
from tests.unit.test_data_read import write_jsonl
from tests.integration.test_data_tokenize import char_tokenizer, trained_runs


def qa_rows(n: int, prefix: str = "q") -> list[dict]:
    return [{"prompt": f"{prefix}{i}", "response": f"a{i}"} for i in range(n)]


def config(*paths, **kwargs) -> DataConfig:
    train = [{"path": str(p)} if not isinstance(p, dict) else p for p in paths]
    return DataConfig(train=train, **kwargs)


def test_mixes_datasets_and_returns_counts(tmp_path):
    first = write_jsonl(tmp_path / "first.jsonl", qa_rows(10))
    second = write_jsonl(tmp_path / "second.jsonl", [{"text": "hello"}] * 4)
    cfg = config({"path": str(first), "weight": 1.0}, {"path": str(second), "weight": 1.0}, num_examples=12)
    data = load_examples(cfg, char_tokenizer(), seed=0)
    assert data.counts == {"first.jsonl": 6, "second.jsonl": 6}
    assert len(data.train) == 12 and data.validation == [] and data.skipped == {}
    assert {e.source for e in data.train} == {"first.jsonl", "second.jsonl"}
    assert all(1 <= e.row <= 10 for e in data.train)


def test_a_bad_row_stops_loading_with_its_location(tmp_path):
    rows = qa_rows(5)
    rows[2]["response"] = None
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=rf"^{path}, row 3, field 'response': expected a string, got null$"):
        load_examples(config(path), char_tokenizer(), seed=0)


def test_skip_invalid_rows_counts_them(tmp_path, caplog):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, qa_rows(4))
    path.write_text(path.read_text() + '{"prompt": "x", "response": 3}\n{broken\n')
    data = load_examples(config(path, skip_invalid_rows=True), char_tokenizer(), seed=0)
    assert len(data.train) == 4 and data.skipped == {"invalid_row": 2}
    assert "row 5, field 'response': expected a string, got a number (3)" in caplog.text


def test_truncation_drop_counts_and_error_is_not_skipped(tmp_path):
    rows = qa_rows(3) + [{"prompt": "q", "response": "x" * 200}]
    path = write_jsonl(tmp_path / "long.jsonl", rows)
    data = load_examples(config(path, max_length=100, truncation="drop"), char_tokenizer(), seed=0)
    assert len(data.train) == 3 and data.skipped == {"too_long": 1}
    with pytest.raises(DataError, match=r"row 4: \d+ tokens, more than data.max_length=100"):
        load_examples(config(path, max_length=100, truncation="error", skip_invalid_rows=True), char_tokenizer(), seed=0)
    with pytest.raises(DataError, match=r"none of its 1 rows is usable: 0 invalid .* 1 too long for data.max_length=100"):
        load_examples(config(write_jsonl(tmp_path / "all_long.jsonl", rows[3:]), max_length=100, truncation="drop"),
                      char_tokenizer(), seed=0)
    # `right` truncation that leaves the short response rows intact but cuts the long one.
    data = load_examples(config(path, max_length=100, truncation="right"), char_tokenizer(), seed=0)
    assert len(data.train) == 4 and max(len(e.sequences[0]) for e in data.train) == 100


def test_validation_fraction_holds_out_rows_deterministically(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(20))
    cfg = config(path, validation_fraction=0.25)
    data = load_examples(cfg, char_tokenizer(), seed=0)
    assert (len(data.train), len(data.validation)) == (15, 5)
    assert {e.row for e in data.train}.isdisjoint({e.row for e in data.validation})
    assert [e.row for e in load_examples(cfg, char_tokenizer(), seed=0).validation] == [e.row for e in data.validation]
    assert [e.row for e in load_examples(cfg, char_tokenizer(), seed=1).validation] != [e.row for e in data.validation]


def test_validation_datasets(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", qa_rows(6))
    valid = write_jsonl(tmp_path / "valid.jsonl", qa_rows(2, prefix="v"))
    cfg = DataConfig(train=[{"path": str(train)}], validation=[{"path": str(valid)}])
    data = load_examples(cfg, char_tokenizer(), seed=0)
    assert (len(data.train), len(data.validation)) == (6, 2)  # every training row trains: none is held out


def test_incompatible_formats_cannot_be_mixed(tmp_path):
    sft = write_jsonl(tmp_path / "sft.jsonl", qa_rows(2))
    kto = write_jsonl(tmp_path / "kto.jsonl", [{"prompt": "q", "completion": "a", "label": True}] * 2)
    with pytest.raises(ValueError, match="cannot be trained together"):
        load_examples(config(sft, kto), char_tokenizer(), seed=0)


def test_duplicate_dataset_names_are_an_error(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(2))
    with pytest.raises(ValueError, match=r"named \['qa.jsonl'\]"):
        load_examples(config(path, path), char_tokenizer(), seed=0)
    data = load_examples(config(path, {"path": str(path), "name": "again"}), char_tokenizer(), seed=0)
    assert data.counts == {"qa.jsonl": 2, "again": 2}


def test_bundled_chat_sft_with_smollm2(smollm2_tokenizer):
    data = load_examples(DataConfig(train=[{"path": "bundled:chat_sft.jsonl"}]), smollm2_tokenizer, seed=0)
    assert len(data.train) == 200 and data.skipped == {}
    multi_turn = [e for e in data.train if len(trained_runs(smollm2_tokenizer, e.sequences[0])) > 1]
    assert len(multi_turn) >= 5
    for example in data.train:
        ids, mask = example.sequences[0].input_ids, example.sequences[0].loss_mask
        trained = smollm2_tokenizer.decode([t for t, m in zip(ids, mask) if m])
        assert trained.startswith("The answer is ") and trained.endswith(".<|im_end|>")


def test_a_margin_column_reaches_the_reward_model_batch(tmp_path):
    """`preference.rm_margin_field: margin` reads the rows' `margin` column (Llama 2's required score gap)."""
    from oxrl.config.schema import PreferenceConfig
    from oxrl.data.types import pack
    from oxrl.loops.objectives import get_objective
    from tests.integration.test_reward_model_training import tiny_reward_model

    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}", "margin": float(i)} for i in range(3)]
    data = load_examples(config(write_jsonl(tmp_path / "pairs.jsonl", rows)), char_tokenizer(), seed=0)
    batch = pack(sorted(data.train, key=lambda e: e.row))
    assert batch.fields["margin"].tolist() == [0.0, 1.0, 2.0]
    model = tiny_reward_model()
    with_margin = get_objective("rm", PreferenceConfig(rm_margin_field="margin")).compute(model, batch, normaliser=3.0).loss
    without = get_objective("rm").compute(model, batch, normaliser=3.0).loss
    assert float(with_margin.detach()) > float(without.detach())  # the required gaps cost more
    plain = load_examples(config(write_jsonl(tmp_path / "plain.jsonl", [{k: v for k, v in r.items() if k != "margin"} for r in rows])),
                          char_tokenizer(), seed=0)
    assert all(e.fields == {} for e in plain.train)
