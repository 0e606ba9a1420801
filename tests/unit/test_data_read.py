"""Reading rows from every supported source, with 1-based row numbers and clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oxrl.config.schema import DatasetSpec
from oxrl.data.errors import DataError
from oxrl.data.read import read_dataset
from tests.hostile_files import make_fifo, raised_within

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
    with pytest.raises(DataError, match=r"no such bundled dataset; bundled datasets are \['chat_sft.jsonl', 'reasoning_openr1.jsonl'\]"):
        read_dataset(DatasetSpec(path="bundled:nope.jsonl"))


def _write_empty(path: Path) -> Path:
    """A file of `path`'s type with columns but no rows (or no bytes at all)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty_table = pa.table({"prompt": pa.array([], pa.string())})
    if path.name == "header_only.csv":
        path.write_text("prompt,response\n\n")
    elif path.name == "blank.jsonl":
        path.write_text("\n  \n")
    elif path.name == "empty_array.json":
        path.write_text("[]")
    elif path.suffix == ".parquet":
        pq.write_table(empty_table, path)
    elif path.suffix == ".arrow":
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, empty_table.schema) as writer:
            writer.write_table(empty_table)
    else:
        path.write_bytes(b"")
    return path


@pytest.mark.parametrize("name, message", [
    ("empty.jsonl", "the file is empty: no rows"),  # `datasets` alone: a bare StopIteration
    ("blank.jsonl", "the file is empty: no rows"),
    ("empty.json", "the file is empty: no rows"),
    ("empty_array.json", "the dataset is empty: no rows"),
    ("empty.csv", "the file is empty: no rows"),
    ("header_only.csv", r"the file is empty: no rows \(only a header line\)"),
    ("empty.parquet", r"the file is empty: no rows \(a parquet table of 0 rows\)"),
    ("empty.arrow", r"the file is empty: no rows \(an Arrow table of 0 rows\)"),
])
def test_a_source_without_rows_is_a_data_error_naming_it(tmp_path, name, message):
    path = _write_empty(tmp_path / name)
    with pytest.raises(DataError, match=f"^{path}: {message}$"):
        read_dataset(DatasetSpec(path=str(path)))


def test_an_empty_saved_dataset_is_a_data_error(tmp_path):
    from datasets import Dataset, DatasetDict

    empty = Dataset.from_dict({"prompt": []})
    empty.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError, match="saved: the dataset is empty: no rows"):
        read_dataset(DatasetSpec(path=str(tmp_path / "saved")))
    # An empty split does not stop another split from loading.
    DatasetDict({"train": Dataset.from_list(ROWS), "test": empty}).save_to_disk(str(tmp_path / "dict"))
    assert len(read_dataset(DatasetSpec(path=str(tmp_path / "dict"))).rows) == 3
    with pytest.raises(DataError, match="dict/test: the dataset is empty: no rows"):
        read_dataset(DatasetSpec(path=str(tmp_path / "dict"), split="test"))


def test_unreadable_files_and_folders_are_data_errors_naming_them(tmp_path):
    for name in ("latin1.csv", "latin1.jsonl"):
        (tmp_path / name).write_bytes("prompt,response\ncaf\xe9,ok\n".encode("latin-1"))
        with pytest.raises(DataError, match=rf"{name}: not UTF-8 text \(invalid .* at byte 19\)"):
            read_dataset(DatasetSpec(path=str(tmp_path / name)))
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    with pytest.raises(DataError, match=r"fake.parquet: cannot be read as a parquet file: ArrowInvalid: .*magic bytes"):
        read_dataset(DatasetSpec(path=str(tmp_path / "fake.parquet")))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(DataError, match="nothing: cannot read this folder of data files: .*doesn't contain any data files"):
        read_dataset(DatasetSpec(path=str(tmp_path / "nothing")))
    (tmp_path / "files").mkdir()
    write_jsonl(tmp_path / "files" / "train.jsonl", ROWS)
    with pytest.raises(DataError, match=r"files: cannot read this folder of data files: Unknown split \"test\""):
        read_dataset(DatasetSpec(path=str(tmp_path / "files"), split="test"))


# --- paths that are not data files, and records no parser should recurse into ----------------------------------

def test_a_fifo_as_data_path_is_refused_at_once(tmp_path):
    fifo = make_fifo(tmp_path / "train.jsonl")  # opening it would wait for a writer forever, holding the run lock
    error = raised_within(20, lambda: read_dataset(DatasetSpec(path=str(fifo))), [fifo])
    assert isinstance(error, DataError)
    assert str(error) == f"{fifo}: is a FIFO (named pipe), not a regular file: a data path names a data file or a folder of them"


def test_a_symlink_to_a_device_as_data_path_names_what_it_links_to(tmp_path):
    (tmp_path / "train.jsonl").symlink_to("/dev/null")  # a device, as /dev/zero is, but that ends at once
    with pytest.raises(DataError, match=r"train.jsonl: is a character device \(a symlink to /dev/null\), not a regular file"):
        read_dataset(DatasetSpec(path=str(tmp_path / "train.jsonl")))


def test_a_data_folder_holding_a_fifo_names_it(tmp_path):
    folder = tmp_path / "data"
    (folder / "more").mkdir(parents=True)
    write_jsonl(folder / "train.jsonl", ROWS)
    fifo = make_fifo(folder / "more" / "test.jsonl")
    (folder / "more" / "loop").symlink_to(folder)  # a symlink loop is walked once
    error = raised_within(20, lambda: read_dataset(DatasetSpec(path=str(folder))), [fifo])
    assert isinstance(error, DataError) and error.path == str(folder)
    assert f"{fifo} is a FIFO (named pipe), not a regular file: a data folder holds regular files only" in str(error)


def test_a_saved_dataset_whose_state_file_is_a_fifo_is_refused(tmp_path):
    from datasets import Dataset

    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    state = tmp_path / "saved" / "state.json"
    state.unlink()
    make_fifo(state)
    error = raised_within(20, lambda: read_dataset(DatasetSpec(path=str(tmp_path / "saved"))), [state])
    assert isinstance(error, DataError) and f"{state} is a FIFO" in str(error)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [101, 200_000])  # 200,000: pyarrow's reader segfaults; json raises RecursionError
def test_a_jsonl_row_nested_too_deep_is_an_invalid_row_naming_it(tmp_path, depth):
    path = tmp_path / "deep.jsonl"
    path.write_text(f'{{"prompt": "a", "response": "b"}}\n{{"prompt": {nested(depth)}, "response": "x"}}\n'
                    '{"prompt": "[[[[ a bracket in text is not nesting", "response": "c"}\n')
    rows = read_dataset(DatasetSpec(path=str(path))).rows
    assert [row.values for row in rows] == [{"prompt": "a", "response": "b"}, {},
                                            {"prompt": "[[[[ a bracket in text is not nesting", "response": "c"}]
    assert str(rows[1].error) == (f"{path}, row 2: its arrays and objects nest more than 100 levels deep, which no "
                                  "training record needs")


def test_a_json_array_element_nested_too_deep_is_an_error_naming_it(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(ROWS)[:-1] + ', {"prompt": "\\" [[", "response": ' + nested(200_000) + "}]")
    with pytest.raises(DataError, match=rf"^{path}, row 4: its arrays and objects nest more than 100 levels deep"):
        read_dataset(DatasetSpec(path=str(path)))
    path.write_text(json.dumps([{"prompt": nested(99), "response": "r"}] * 3))  # 100 levels: still a record
    assert len(read_dataset(DatasetSpec(path=str(path))).rows) == 3



def test_the_nesting_scan_counts_brackets_outside_strings_only():
    from oxrl.nesting import too_deep, too_deep_element

    deep, shallow = nested(101).encode(), nested(99).encode()
    assert too_deep(b'{"a": ' + deep + b"}") and not too_deep(b'{"a": ' + shallow + b"}")
    assert not too_deep(b'{"a": "\\" ' + b"[" * 500 + b'"}')  # brackets after an escaped quote are still text
    assert too_deep(b'{"a": "\\\\", "b": ' + deep + b"}")  # an escaped backslash ends before the closing quote
    assert not too_deep(b'{"a": "\\\\\\"' + b"{" * 500 + b'"}')
    assert too_deep_element(b'[{"a": 1},\n {"b": "],["},\n {"c": ' + deep + b"}]") == 3
    assert too_deep_element(b"[" + b", ".join([shallow] * 300) + b"]") is None


@pytest.mark.parametrize("name, text", [("train.jsonl", '{"prompt": "a", "response": "b"}\n\n{"prompt": NESTED}\n'),
                                        ("train.json", '[{"prompt": "a"}, {"prompt": NESTED}]')])
def test_a_data_folder_with_a_record_nested_too_deep_is_refused_naming_the_file_and_row(tmp_path, name, text):
    """As for a file named directly: found before pyarrow's parser, which crashes the process on it (SIGSEGV)."""
    folder = tmp_path / "data"
    (folder / "more").mkdir(parents=True)
    write_jsonl(folder / "test.jsonl", ROWS)
    (folder / "more" / name).write_text(text.replace("NESTED", nested(200_000)))
    with pytest.raises(DataError, match=rf"^{folder / 'more' / name}, row 2: its arrays and objects nest more than 100"):
        read_dataset(DatasetSpec(path=str(folder), split="train"))


@pytest.mark.parametrize("file, text, problem", [
    ("dataset_dict.json", "{}", r"field 'splits': expected a JSON object with a list 'splits', as `datasets` "
                                r"save_to_disk writes it; found 'splits': null"),
    ("dataset_dict.json", '{"splits": "train"}', r"field 'splits': .*found 'splits': \"train\""),
    ("dataset_dict.json", "[]", r"field 'splits': .*found a JSON list"),
    ("dataset_dict.json", "{splits", r"not JSON: Expecting property name"),
    ("dataset_dict.json", nested(200_000), r"field 'splits': .*found nesting too deep"),
    ("train/state.json", "[]", r"field '_data_files': expected a JSON object with a list '_data_files'.* a JSON list"),
    ("train/state.json", '{"_data_files": 3}', r"field '_data_files': .*found '_data_files': 3"),
    ("train/state.json", b"\xff\xfe", r"not JSON: "),
])
def test_damaged_metadata_of_a_saved_dataset_is_refused_naming_the_file_and_the_key(tmp_path, file, text, problem):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "saved"))
    path = tmp_path / "saved" / file
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataError, match=rf"^{path}(, field '\w+')?: ") as refused:
        read_dataset(DatasetSpec(path=str(tmp_path / "saved")))
    assert re.search(problem, str(refused.value)), refused.value


def test_a_string_that_is_not_text_is_an_invalid_row_naming_its_field(tmp_path):
    """A lone surrogate: valid JSON (an escape of half a character), which no tokenizer takes."""
    path = tmp_path / "chat.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "caf\\u00e9"}]}\n'
                    '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x\\ud800"}]}\n'
                    '{"messages": [{"role": "user", "content": "a pair \\ud83d\\ude00 is one character"}]}\n')
    rows = read_dataset(DatasetSpec(path=str(path))).rows
    assert [row.error is None for row in rows] == [True, False, True]
    assert rows[1].values == {}
    assert str(rows[1].error) == (f"{path}, row 2, field 'messages[1].content': holds a lone surrogate (an escape "
                                  "such as \\ud800 that is half of a character), which is not text")


def test_bytes_that_are_not_utf8_in_a_jsonl_file_are_refused_naming_the_file(tmp_path):
    """pyarrow reads such a JSON Lines file without complaint and fails only when its rows are read."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"prompt": "caf\xe9", "response": "ok"}\n{"prompt": "b", "response": "c"}\n')
    with pytest.raises(DataError, match=rf"^{path}: not UTF-8 text \(invalid continuation byte at byte 15\)"):
        read_dataset(DatasetSpec(path=str(path)))


@pytest.mark.parametrize("data, setting", [
    ({"train": [{"path": "a.jsonl"}, {"path": "  "}]}, "data.train.1.path"),
    ({"train": [{"path": "a.jsonl"}], "validation": [{"path": ""}]}, "data.validation.0.path"),
])
def test_an_empty_data_path_is_refused_by_the_config_naming_the_setting(data, setting):
    """Not read as the working directory (`Path("")`): refused when the config is validated, before anything runs."""
    from oxrl.config.load import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"`{re.escape(setting)}` = '\s*': is empty; set it to a data file"):
        load_config(None, base={"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}, "data": data})
