"""Reading rows from every supported source, with 1-based row numbers and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oxrl.config.schema import DatasetSpec
from oxrl.data.errors import DataError
from oxrl.data.read import read_dataset

ROWS = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(1, 4)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _write(tmp_path: Path, suffix: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, ROWS)
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    elif suffix == ".csv":
        path.write_text("prompt,response\n" + "".join(f"{r['prompt']},{r['response']}\n" for r in ROWS))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    elif suffix == ".arrow":
        table = pa.Table.from_pylist(ROWS)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet", ".arrow"])
def test_every_file_type(tmp_path, suffix):
    data = read_dataset(DatasetSpec(path=str(_write(tmp_path, suffix))))
    assert data.name == f"data{suffix}"
    assert data.columns == ["prompt", "response"]
    assert [(row.number, row.values) for row in data.rows] == list(enumerate(ROWS, start=1))


def test_csv_cells_stay_text(tmp_path):
    path = tmp_path / "numbers.csv"
    path.write_text("prompt,response,label\n2+2,4,true\nnothing,NA,\n")
    rows = [row.values for row in read_dataset(DatasetSpec(path=str(path))).rows]
    assert rows == [{"prompt": "2+2", "response": "4", "label": "true"}, {"prompt": "nothing", "response": "NA", "label": ""}]


def test_saved_dataset_folders(tmp_path):
    from datasets import Dataset, DatasetDict

    train, test = Dataset.from_list(ROWS), Dataset.from_list(ROWS[:1])
    train.save_to_disk(str(tmp_path / "single"))
    DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dict"))
    assert len(read_dataset(DatasetSpec(path=str(tmp_path / "single"))).rows) == 3
    assert [r.values for r in read_dataset(DatasetSpec(path=str(tmp_path / "dict"), split="test")).rows] == ROWS[:1]
    with pytest.raises(DataError, match=r"dict: no split 'validation'; the splits are \['train', 'test'\]"):
        read_dataset(DatasetSpec(path=str(tmp_path / "dict"), split="validation"))


def test_folder_of_data_files(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ROWS)
    write_jsonl(folder / "test.jsonl", ROWS[:2])
    assert len(read_dataset(DatasetSpec(path=str(folder), split="test")).rows) == 2


def test_relative_paths_look_in_oxrl_data_dir_first(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    (tmp_path / "cwd").mkdir()
    write_jsonl(tmp_path / "store" / "d.jsonl", ROWS)
    write_jsonl(tmp_path / "cwd" / "d.jsonl", ROWS[:1])
    monkeypatch.chdir(tmp_path / "cwd")
    assert len(read_dataset(DatasetSpec(path="d.jsonl")).rows) == 1
    monkeypatch.setenv("OXRL_DATA_DIR", str(tmp_path / "store"))
    data = read_dataset(DatasetSpec(path="d.jsonl"))
    assert len(data.rows) == 3 and data.location == str(tmp_path / "store" / "d.jsonl")


def test_renames_and_max_rows(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}] * 5)
    data = read_dataset(DatasetSpec(path=str(path), columns={"question": "prompt", "answer": "response"}, max_rows=2))
    assert data.columns == ["prompt", "response"]
    assert [row.values for row in data.rows] == [{"prompt": "q", "response": "a"}] * 2
    with pytest.raises(DataError, match=r"qa.jsonl, field 'query': cannot rename column 'query' to 'prompt': no such column"):
        read_dataset(DatasetSpec(path=str(path), columns={"query": "prompt"}))


def test_broken_json_line_gets_its_row_number(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "a"}\n{"text": oops}\n["not", "an", "object"]\n{"text": "d"}\n')
    rows = read_dataset(DatasetSpec(path=str(path))).rows
    assert [row.values for row in rows] == [{"text": "a"}, {}, {}, {"text": "d"}]
    assert str(rows[1].error).startswith(f"{path}, row 2: not valid JSON")
    assert str(rows[2].error) == f"{path}, row 3: expected a JSON object, got list"


def test_missing_local_file(tmp_path):
    with pytest.raises(DataError, match=r"nope/train.jsonl: file not found"):
        read_dataset(DatasetSpec(path="nope/train.jsonl"))


def test_unknown_hub_name_offline_is_a_clear_chained_error(monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # no network in tests, and no retries
    with pytest.raises(DataError, match=r"someone/no-such-dataset: is not a local file or folder and could not be fetched "
                                        r"from the Hugging Face hub \(no network\?\)") as caught:
        read_dataset(DatasetSpec(path="someone/no-such-dataset"))
    assert caught.value.__cause__ is not None


def test_bundled_dataset():
    data = read_dataset(DatasetSpec(path="bundled:chat_sft.jsonl"))
    assert data.name == "chat_sft.jsonl" and len(data.rows) == 200 and data.columns == ["messages"]
    with pytest.raises(DataError, match=r"no such bundled dataset; bundled datasets are \['chat_sft.jsonl'\]"):
        read_dataset(DatasetSpec(path="bundled:nope.jsonl"))
