"""Read a dataset's rows, each with its 1-based row number, from wherever `DatasetSpec.path` points.

Where a path is looked up, in order:
  1. `bundled:<file>` -> a file shipped in `oxrl/data/bundled/` (e.g. `bundled:chat_sft.jsonl`);
  2. a relative path -> `$OXRL_DATA_DIR/<path>` when that variable is set and the file exists there,
     else `<path>` relative to the working directory;
  3. anything else that is not on disk -> a Hugging Face hub dataset name (`load_dataset(name, split)`).

Local files are read with `datasets` by suffix (.json/.jsonl/.csv/.parquet/.arrow); a folder is a
`save_to_disk` dataset (the configured split of a DatasetDict) or a folder of data files.

Row numbers count records from 1 in file order: in a JSON Lines file row N is the N-th non-blank
line, in a CSV file the N-th line after the header.

A source with no rows (an empty file, a CSV file with only its header, an empty JSON array, a
parquet file or saved dataset of 0 rows) is a `DataError`, as is a file `datasets` cannot parse.

A data path is a regular file or a folder of them (oxrl/files.py): a FIFO, a device such as /dev/zero
(or a symlink to one), anywhere under a data folder too, is a `DataError` before anything opens it. A JSON
record nested more than MAX_JSON_DEPTH levels deep is an invalid row, found before a parser recurses into it
(oxrl/nesting.py); the file is then read record by record, as one with a broken line is. In a folder of data
files, such a record is a `DataError` naming its file and row. A string that cannot be text (a lone surrogate,
`"\\ud800"`, which JSON can escape) makes its row invalid, naming the field; text that is not UTF-8 names the file
and the byte; a saved dataset's `dataset_dict.json` or `state.json` that is not what `datasets` writes names the
file and the key; an empty `path` is refused rather than read as the working directory.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oxrl.config.schema import DatasetSpec
from oxrl.data.errors import DataError
from oxrl.files import InputFileError, check_regular, first_irregular, read_bounded
from oxrl.logging.quiet import no_dataset_bars

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).parent / "bundled"
BUNDLED_PREFIX = "bundled:"
# File suffix -> the `datasets` builder that reads it.
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
# dataset_dict.json and state.json of a saved dataset are a few kB: a bound far above keeps a huge one from being read
SAVED_METADATA_LIMIT = 16 << 20


@dataclass
class Row:
    number: int  # 1-based, see the module docstring
    values: dict[str, Any]
    # Set when the record could not even be parsed (a broken JSON line); `values` is then empty.
    error: DataError | None = None


@dataclass
class RawDataset:
    name: str  # for logs and mixing counts
    location: str  # what error messages call the source: the resolved file or the hub name
    columns: list[str]  # after renames
    rows: list[Row]
    # A local file's folder, which relative paths in its rows (images) are relative to; None for folders and
    # hub datasets, whose relative paths are relative to the working directory.
    root: Path | None = None


def dataset_name(spec: DatasetSpec) -> str:
    return spec.name or Path(spec.path.removeprefix(BUNDLED_PREFIX)).name


def resolve_local(path: str) -> Path | None:
    """The local file or folder `path` names, or None when it names none (then it may be a hub name)."""
    if path.startswith(BUNDLED_PREFIX):
        bundled = BUNDLED_DIR / path.removeprefix(BUNDLED_PREFIX)
        if not bundled.exists():
            available = sorted(p.name for p in BUNDLED_DIR.glob("*.jsonl"))
            raise DataError(path, None, None, f"no such bundled dataset; bundled datasets are {available}")
        return bundled
    candidate = Path(path).expanduser()
    data_dir = os.environ.get("OXRL_DATA_DIR")
    if data_dir and not candidate.is_absolute() and (Path(data_dir) / candidate).exists():
        return Path(data_dir) / candidate
    return candidate if candidate.exists() else None


def read_dataset(spec: DatasetSpec) -> RawDataset:
    """All rows of one dataset (at most `spec.max_rows`), columns renamed per `spec.columns`."""
    local = resolve_local(spec.path)
    if local is None:
        if Path(spec.path).suffix.lower() in FILE_BUILDERS or spec.path.startswith(("/", "./", "../", "~")):
            # It looks like a file system path, so it is a missing file, not a hub name.
            data_dir = os.environ.get("OXRL_DATA_DIR")
            where = f"OXRL_DATA_DIR={data_dir} and the working directory" if data_dir else "the working directory"
            raise DataError(spec.path, None, None, f"file not found (looked in {where})")
        location, loaded = spec.path, _load_from_hub(spec)
    elif local.is_dir():
        _check_folder(local)
        location, loaded = str(local), _load_folder(local, spec.split)
    else:
        _check_file(local)
        location, loaded = str(local), _load_file(local)

    if not isinstance(loaded, list):
        if spec.max_rows is not None and len(loaded) > spec.max_rows:
            loaded = loaded.select(range(spec.max_rows))
        loaded = _dataset_rows(loaded, location, local)
    columns = list(dict.fromkeys(key for row in loaded for key in row.values))
    rows = [_text_checked(row, location) for row in (loaded[: spec.max_rows] if spec.max_rows else loaded)]
    if not rows:  # e.g. an empty JSON array, a saved dataset of 0 rows (empty files are caught when read)
        raise DataError(location, None, None, "the dataset is empty: no rows")
    columns, rows = _rename_columns(columns, rows, spec.columns, location)
    root = local.parent if local is not None and local.is_file() else None
    return RawDataset(dataset_name(spec), location, columns, rows, root)


def _check_file(path: Path) -> None:
    """A DataError unless `path` is a regular file (opening a FIFO waits forever; a device never ends)."""
    try:
        check_regular(path)
    except InputFileError as error:
        raise DataError(str(path), None, None, f"{error}: a data path names a data file or a folder of them") from None
    except OSError as error:  # a broken symlink, no permission
        raise DataError(str(path), None, None, f"cannot read it: {error.strerror or error}") from error


def _check_folder(folder: Path) -> None:
    """A DataError naming the first entry under `folder` that is not a regular file or a folder."""
    try:
        irregular = first_irregular(folder)
    except OSError as error:  # a sub-folder without permission
        raise DataError(str(folder), None, None, f"cannot read this folder: {error}") from error
    if irregular is not None:
        entry, problem = irregular
        raise DataError(str(folder), None, None, f"{entry} {problem}: a data folder holds regular files only")


def _rename_columns(
    columns: list[str], rows: list[Row], renames: dict[str, str], location: str
) -> tuple[list[str], list[Row]]:
    if not renames:
        return columns, rows
    for old, new in renames.items():
        cannot = f"cannot rename column {old!r} to {new!r}"
        if old not in columns:
            raise DataError(location, None, old, f"{cannot}: no such column; the columns are {columns}")
        if new in columns and new not in renames:
            raise DataError(location, None, old, f"{cannot}: the file already has a column {new!r}")
    renamed = [Row(row.number, {renames.get(k, k): v for k, v in row.values.items()}, row.error) for row in rows]
    return [renames.get(c, c) for c in columns], renamed


def _load_from_hub(spec: DatasetSpec) -> Dataset:
    from datasets import load_dataset

    try:
        return load_dataset(spec.path, split=spec.split)
    except OSError as error:  # ConnectionError and DatasetNotFoundError are OSErrors
        raise DataError(
            spec.path,
            None,
            None,
            "is not a local file or folder and could not be fetched from the Hugging Face hub (no network?): "
            f"{type(error).__name__}: {error}",
        ) from error


def _load_folder(folder: Path, split: str) -> Dataset:
    from datasets import load_dataset

    if (folder / "dataset_dict.json").exists() or (folder / "state.json").exists():
        return _load_saved(folder, split)
    for path in sorted(folder.rglob("*")):  # as for a file named directly: before pyarrow's parser crashes on it
        if FILE_BUILDERS.get(path.suffix.lower()) == "json" and (row := _too_deep_row(path)) is not None:
            raise DataError(str(path), row, None, _too_deep_problem())
    # A plain folder of data files (train.jsonl, test.jsonl, ...): `datasets` maps files to splits.
    try:
        with no_dataset_bars():
            return load_dataset(str(folder), split=split)
    except (FileNotFoundError, ValueError) as error:  # no data files (EmptyDatasetError); no such split
        raise DataError(str(folder), None, None, f"cannot read this folder of data files: {error}") from error


def _load_saved(folder: Path, split: str) -> Dataset:
    """A `save_to_disk` folder: the dataset, or the `split` of a DatasetDict (only that split is loaded)."""
    from datasets import load_from_disk

    if (folder / "dataset_dict.json").exists():
        splits = _saved_metadata(folder / "dataset_dict.json", "splits")
        if split not in splits:
            raise DataError(str(folder), None, None, f"no split {split!r}; the splits are {splits} (set `split`)")
        folder = folder / split
    # A dataset saved with 0 rows has no data files, and `load_from_disk` fails on it with an IndexError.
    if _saved_metadata(folder / "state.json", "_data_files") == []:
        raise DataError(str(folder), None, None, "the dataset is empty: no rows")
    return load_from_disk(str(folder))


def _saved_metadata(path: Path, key: str) -> list:
    """The list `key` of a `save_to_disk` JSON file (dataset_dict.json's splits, state.json's data files); a DataError
    naming the file and the key when it is not the JSON object `datasets` writes."""
    from oxrl.nesting import too_deep

    try:
        text = read_bounded(path, SAVED_METADATA_LIMIT, "metadata file of a saved dataset")
        value = None if too_deep(text) else json.loads(text)  # (deep nesting: RecursionError in `json`)
    except InputFileError as error:
        raise DataError(str(path), None, None, str(error)) from None
    except OSError as error:  # not found (state.json of a split), no permission
        raise DataError(str(path), None, None, f"cannot read it: {error.strerror or error}") from error
    except ValueError as error:  # not JSON, not UTF-8
        raise DataError(str(path), None, None, f"not JSON: {error}") from error
    found = value.get(key) if isinstance(value, dict) else None
    if not isinstance(found, list):
        shown = f"{key!r}: {json.dumps(found)[:40]}" if isinstance(value, dict) else f"a JSON {type(value).__name__}"
        raise DataError(str(path), None, key, f"expected a JSON object with a list {key!r}, as `datasets` "
                        f"save_to_disk writes it; found {shown if value is not None else 'nesting too deep'}")
    return found


def _load_file(path: Path) -> Dataset | list[Row]:
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    suffix = path.suffix.lower()
    builder = FILE_BUILDERS.get(suffix)
    if builder is None:
        raise DataError(str(path), None, None, f"unknown file type {suffix!r}; expected one of {sorted(FILE_BUILDERS)}")
    try:
        no_rows = _why_no_rows(path, builder)
        if no_rows is None and builder == "json" and _too_deep_row(path) is not None:
            logger.info("%s: a record nests too deep for datasets' parser; reading it record by record", path)
            return _read_json_records(path)
        if no_rows is None:
            with no_dataset_bars():  # a local file: its "Generating train split" bar says nothing
                return _load_csv(path) if builder == "csv" else load_dataset(builder, data_files=str(path), split="train")
    except (DatasetGenerationError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        if builder != "json":
            raise _unreadable(path, builder, error) from error
        # pyarrow could not parse the file as a whole (a broken line); parse it record by record
        # so that the broken records get their own row numbers.
        logger.info("%s: datasets could not read it (%s); reading it record by record", path, error.__cause__ or error)
        return _read_json_records(path)
    raise DataError(str(path), None, None, f"the file is empty: no rows{no_rows}")


def _why_no_rows(path: Path, builder: str) -> str | None:
    """None when the file has rows, else the detail for the error message (empty, or " (why)").

    Checked before `datasets` reads the file: it fails on files without rows with a bare
    StopIteration (JSON) or an unrelated message (CSV, parquet, arrow).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if _is_blank(path):
        return ""
    if builder == "csv":
        # CSV cells are UTF-8 text; -sig: as pandas, ignore a BOM.
        with path.open(newline="", encoding="utf-8-sig") as handle:
            records = csv.reader(handle)
            next(records, None)  # the header
            # any() stops at the first non-blank record (pandas skips blank lines too).
            return None if any(records) else " (only a header line)"
    if builder == "parquet":
        return None if pq.read_metadata(path).num_rows else " (a parquet table of 0 rows)"  # reads the footer only
    if builder == "arrow":
        with pa.memory_map(str(path)) as source:  # zero-copy: reading the table costs no memory
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:  # not a stream: the IPC file format, which `datasets` reads too
                table = pa.ipc.open_file(source).read_all()
        return None if table.num_rows else " (an Arrow table of 0 rows)"
    return None


def _too_deep_row(path: Path) -> int | None:
    """The number of the first record of the JSON file `path` that nests more than MAX_JSON_DEPTH levels deep, or
    None: a file that starts with `[` is one array of records (as `datasets` reads it), any other a record per
    (non-blank) line."""
    from oxrl.nesting import too_deep, too_deep_element

    with path.open("rb") as handle:
        if handle.read(1 << 12).lstrip(b" \t\r\n\xef\xbb\xbf").startswith(b"["):
            handle.seek(0)
            return too_deep_element(handle.read())
        handle.seek(0)
        records = (line for line in handle if line.strip())
        return next((number for number, line in enumerate(records, start=1) if too_deep(line)), None)


def _load_csv(path: Path) -> Dataset:
    from datasets import Features, Value, load_dataset

    # CSV cells are text: read every column as a string so "42" stays "42" and "NA" stays "NA".
    with path.open(newline="", encoding="utf-8-sig") as handle:
        header = next(csv.reader(handle), [])
    features = Features({name: Value("string") for name in header})
    return load_dataset("csv", data_files=str(path), split="train", features=features, na_filter=False)


def _is_blank(path: Path) -> bool:
    """Whether the file holds nothing but whitespace (read until the first other byte)."""
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 16):
            if chunk.strip():
                return False
    return True


def _unreadable(path: Path, builder: str, error: Exception) -> DataError:
    cause = error.__cause__ or error  # DatasetGenerationError wraps the parser's own error
    if isinstance(cause, UnicodeDecodeError):
        return DataError(str(path), None, None, f"not UTF-8 text ({cause.reason} at byte {cause.start})")
    return DataError(str(path), None, None, f"cannot be read as a {builder} file: {type(cause).__name__}: {cause}")


def _too_deep_problem() -> str:
    from oxrl.nesting import TOO_DEEP

    return TOO_DEEP


def _read_json_records(path: Path) -> list[Row]:
    from oxrl.nesting import too_deep, too_deep_element

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise _unreadable(path, "json", error) from error
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        if (element := too_deep_element(text.encode("utf-8"))) is not None:
            raise DataError(str(path), element, None, _too_deep_problem())
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            problem = f"not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
            raise DataError(str(path), None, None, problem) from error
        return [_record_row(str(path), number, record) for number, record in enumerate(records, start=1)]
    rows = []
    for number, line in enumerate((line for line in text.splitlines() if line.strip()), start=1):
        if too_deep(line.encode("utf-8")):
            rows.append(Row(number, {}, DataError(str(path), number, None, _too_deep_problem())))
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            problem = f"not valid JSON: {error.msg} (column {error.colno})"
            rows.append(Row(number, {}, DataError(str(path), number, None, problem)))
            continue
        rows.append(_record_row(str(path), number, record))
    return rows


def _record_row(location: str, number: int, record: Any) -> Row:
    if not isinstance(record, dict):
        return Row(number, {}, DataError(location, number, None, f"expected a JSON object, got {type(record).__name__}"))
    return Row(number, record)


def _dataset_rows(loaded: Dataset, location: str, local: Path | None) -> list[Row]:
    """The rows of a loaded dataset. pyarrow keeps bytes that are not UTF-8 in a JSON file's text unchecked, and
    fails on them only here: such a file is read again as JSON records, which names the file and the byte."""
    try:
        return [Row(number, values) for number, values in enumerate(loaded.to_list(), start=1)]
    except UnicodeDecodeError as error:
        if local is not None and local.is_file() and FILE_BUILDERS.get(local.suffix.lower()) == "json":
            logger.info("%s: text that is not UTF-8 (%s); reading it again to find where", local, error.reason)
            return _read_json_records(local)
        raise DataError(location, None, None, f"holds text that is not UTF-8 ({error.reason})") from error


def _text_checked(row: Row, location: str) -> Row:
    """`row`, or (an invalid row) an error naming its first string that is not text: a lone surrogate such as
    "\\ud800", which JSON can escape but which is half a character, and which no tokenizer takes."""
    field = None if row.error is not None else _not_text(row.values, "")
    if field is None:
        return row
    problem = "holds a lone surrogate (an escape such as \\ud800 that is half of a character), which is not text"
    return Row(row.number, {}, DataError(location, row.number, field, problem))


def _not_text(value: Any, field: str) -> str | None:
    """Where in `value` (a field such as `messages[1].content`) its first string that cannot be UTF-8 is; or None."""
    if isinstance(value, str):
        return None if value.isascii() or _encodes(value) else field
    if isinstance(value, dict):
        items = ((f"{field}.{key}" if field else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{field}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    return next((found for name, item in items if (found := _not_text(item, name)) is not None), None)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
