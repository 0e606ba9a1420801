"""Robot demonstrations in the LeRobot dataset layout, read and written with pyarrow (not the `lerobot` package).

A LeRobot dataset is a folder (LeRobot's `lerobot/datasets/utils.py` defines it):

    meta/info.json     codebase_version, fps and `features` {key: {dtype, shape, names}}: cameras have dtype
                       "image" and shape [height, width, channels]; "observation.state" and "action" are float
                       vectors of shape [n]; timestamp, frame_index, episode_index, index and task_index are
                       per-frame scalars.
    data/*/*.parquet   a row per frame, a column per feature; an image is a struct {bytes, path} holding the
                       encoded PNG. v2.1: a file per episode (data/chunk-000/episode_000000.parquet); v3.0:
                       many episodes per file (data/chunk-000/file-000.parquet).
    tasks              v2.1: meta/tasks.jsonl, lines {"task_index", "task"}; v3.0: meta/tasks.parquet, a
                       task_index column whose pandas index is the task text.
    episodes           v2.1: meta/episodes.jsonl, lines {"episode_index", "tasks", "length"}; v3.0:
                       meta/episodes/chunk-000/file-000.parquet, the same plus where each episode's frames are.
    meta/stats.json    per feature min/max/mean/std/count and q01..q99, per camera channel min/max/mean/std of
                       its pixels in [0, 1] (written for LeRobot, whose policies normalise with them; not read).

`read_dataset` reads v2.1 and v3.0 and checks everything it reads; `write_dataset` writes v3.0.

Limits: cameras stored as video (dtype "video", .mp4 files) are refused: decoding them needs a video decoder,
which oxRL does not have. Images must be embedded in the parquet files (not paths), PNG or JPEG, at most
4096x4096 pixels. An episode has one task. Other features (rewards, ...) must be present but are not
returned. The whole dataset is decoded into memory, which suits demonstration sets of modest size. Bad
input is a `DataError` naming the file, the 1-based row within it and the field; nothing is unpickled. Every
file read is a regular file inside the dataset folder: a FIFO, a device (or a symlink to one) and a symlink out of
the folder (as a Hugging Face cache snapshot holds: download with `--local-dir` instead) are refused, and JSON nested
deeper than oxrl/nesting.py's bound is refused before a parser recurses into it.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from oxrl.data.errors import DataError
from oxrl.nesting import TOO_DEEP, too_deep
from oxrl.files import InputFileError, check_regular

SUPPORTED_VERSIONS = ("v2.1", "v3.0")
MAX_IMAGE_SIDE = 4096
_IMAGE_FORMATS = ("PNG", "JPEG")  # what LeRobot embeds; other decoders are attack surface we do not need
_IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
_STATE, _ACTION = "observation.state", "action"
_FRAME_COLUMNS = ("episode_index", "frame_index", "task_index")
_SCALARS = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
            "task_index": "int64"}


@dataclass
class Frame:
    images: dict[str, Image.Image]  # camera feature key -> RGB image, in info.json feature order
    state: np.ndarray | None  # float32 [state_dim]; None when the dataset has no observation.state
    action: np.ndarray  # float32 [action_dim]
    index: int  # frame_index within the episode


@dataclass
class Episode:
    index: int  # episode_index
    task: str  # the episode's instruction
    frames: list[Frame]  # in frame_index order


@dataclass
class LeRobotDataset:
    root: Path
    fps: int
    version: str  # "v2.1" or "v3.0"
    image_keys: list[str]
    image_shapes: dict[str, tuple[int, int, int]]  # (height, width, channels) from info.json
    state_dim: int | None
    action_dim: int
    episodes: list[Episode]

    def actions(self) -> np.ndarray:
        """Every action, episode after episode in frame order: float32 [total_frames, action_dim]."""
        rows = [frame.action for episode in self.episodes for frame in episode.frames]
        return np.stack(rows) if rows else np.zeros((0, self.action_dim), np.float32)

    def states(self) -> np.ndarray | None:
        """Every frame's state, as `actions` orders them: float32 [total_frames, state_dim]; None without states."""
        if self.state_dim is None:
            return None
        rows = [frame.state for episode in self.episodes for frame in episode.frames]
        return np.stack(rows) if rows else np.zeros((0, self.state_dim), np.float32)


@dataclass
class EpisodeRecord:
    """One demonstration, as `write_dataset` takes it."""

    task: str
    images: dict[str, np.ndarray]  # camera key -> uint8 [T, H, W, 3]
    states: np.ndarray | None  # float32 [T, state_dim]
    actions: np.ndarray  # float32 [T, action_dim]


# ------------------------------------------------------------------------------------------------ reading


def read_dataset(root: Path) -> LeRobotDataset:
    """The dataset at `root` (v2.1 or v3.0 layout), decoded and checked; bad input is a DataError."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not os.path.lexists(info_path):
        what = "does not exist" if not root.exists() else "is a file" if not root.is_dir() else (
            f"contains {sorted(p.name for p in root.iterdir())[:20]}")
        raise DataError(str(root), None, None,
                        f"not a LeRobot dataset folder: expected meta/info.json; the folder {what}")
    info = _load_json(info_path, root)
    version, features, fps = info.get("codebase_version"), info.get("features"), info.get("fps")
    if version not in SUPPORTED_VERSIONS:
        raise DataError(str(info_path), None, "codebase_version",
                        f"expected one of {list(SUPPORTED_VERSIONS)} (the layouts oxRL reads), found {version!r}")
    if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
        raise DataError(str(info_path), None, "features",
                        f"expected {{key: {{dtype, shape, names}}}}, found {features!r:.80}")
    for key, feature in features.items():  # refused before any frame is read: nothing else could be used
        if feature.get("dtype") == "video":
            raise DataError(str(info_path), None, f"features.{key}",
                            "frames stored as video need a video decoder, which oxRL does not read; re-export the "
                            "dataset with image features (LeRobot's video=False: images stored in the parquet files)")
    if _ACTION not in features:
        raise DataError(str(info_path), None, "features", f"expected an 'action' feature, found {list(features)}")
    if not isinstance(fps, (int, float)) or isinstance(fps, bool) or fps <= 0 or not float(fps).is_integer():
        raise DataError(str(info_path), None, "fps", f"expected a positive whole number, found {fps!r}")
    action_dim = _vector_dim(info_path, features, _ACTION)
    state_dim = _vector_dim(info_path, features, _STATE) if _STATE in features else None
    image_shapes = {key: _image_shape(info_path, key, f) for key, f in features.items() if f.get("dtype") == "image"}

    tasks, tasks_name = _read_tasks(root, version)
    listed, listed_name = _read_episode_list(root, version)
    data_files = sorted((root / "data").glob("*/*.parquet"))
    if not data_files:
        raise DataError(str(root / "data"), None, None, "expected parquet files data/chunk-*/*.parquet, found none")
    frames: dict[int, list[tuple[int, str, int, int, Frame]]] = {}  # episode -> [(frame_index, file, row, task, frame)]
    vectors = {_ACTION: action_dim} | ({_STATE: state_dim} if state_dim else {})
    for path in data_files:
        _read_data_file(path, root, features, vectors, image_shapes, tasks, tasks_name, frames)

    for ep, rows in frames.items():
        if ep not in listed:
            raise DataError(rows[0][1], rows[0][2], "episode_index",
                            f"expected every episode_index to be listed in {listed_name}; episode {ep} is not")
    episodes = []
    for ep, (list_path, list_row, length) in sorted(listed.items()):
        rows = frames.get(ep, [])
        if not rows:
            raise DataError(list_path, list_row, "episode_index",
                            f"expected frames of episode {ep} in data/, found none")
        seen: set[int] = set()
        for frame_index, path, row, _, _ in rows:  # in file order, so that the row named is the odd one out
            if not 0 <= frame_index < len(rows) or frame_index in seen:
                found = sorted(item[0] for item in rows)[:20]
                raise DataError(path, row, "frame_index", f"expected the frame_index values of episode {ep} "
                                f"to be 0..{len(rows) - 1}, found {found}")
            seen.add(frame_index)
        rows.sort(key=lambda item: item[0])
        if length != len(rows):
            raise DataError(list_path, list_row, "length",
                            f"expected {len(rows)} (the frames of episode {ep} in data/), found {length}")
        task_indices = sorted({item[3] for item in rows})
        if len(task_indices) > 1:
            raise DataError(rows[0][1], rows[0][2], "task_index", "expected one task per episode (oxRL reads one "
                            f"instruction per demonstration); episode {ep} has task_index values {task_indices}")
        episodes.append(Episode(ep, tasks[task_indices[0]], [item[4] for item in rows]))
    return LeRobotDataset(root, int(fps), version, list(image_shapes), image_shapes, state_dim, action_dim, episodes)


def _read_data_file(path: Path, root: Path, features: dict, vectors: dict[str, int], image_shapes: dict,
                    tasks: dict[int, str], tasks_name: str, frames: dict[int, list]) -> None:
    """Check and decode every row of one data file into `frames` (episode -> rows), before any ordering."""
    names = _parquet(path, root, schema_only=True).names
    for key in [*features, *_FRAME_COLUMNS]:
        if key not in names:
            raise DataError(str(path), None, key,
                            f"expected the column {key!r} named in meta/info.json features; the file has {names}")
    table = _parquet(path, root, columns=[*_FRAME_COLUMNS, *vectors, *image_shapes])
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    for i in range(table.num_rows):
        row = i + 1
        ep, frame_index, task = (_typed(columns[name][i], int, path, row, name) for name in _FRAME_COLUMNS)
        if task not in tasks:
            raise DataError(str(path), row, "task_index",
                            f"expected a task_index listed in {tasks_name} ({sorted(tasks)}), found {task}")
        values = {key: _vector(columns[key][i], dim, path, row, key) for key, dim in vectors.items()}
        images = {key: _decode(columns[key][i], shape, path, row, key) for key, shape in image_shapes.items()}
        frame = Frame(images, values.get(_STATE), values[_ACTION], frame_index)
        frames.setdefault(ep, []).append((frame_index, str(path), row, task, frame))


def _read_tasks(root: Path, version: str) -> tuple[dict[int, str], str]:
    if version == "v2.1":
        path = root / "meta" / "tasks.jsonl"
        pairs = [(row, obj.get("task_index"), obj.get("task")) for row, obj in _jsonl(path, root)]
    else:
        path = root / "meta" / "tasks.parquet"
        table = _parquet(path, root)
        names = table.column_names
        text = "task" if "task" in names else _pandas_index_column(table, path)
        if "task_index" not in names or text is None:
            raise DataError(str(path), None, None,
                            f"expected columns task_index and task (or a pandas index holding the task), found {names}")
        indices, texts = table.column("task_index").to_pylist(), table.column(text).to_pylist()
        pairs = [(i + 1, n, t) for i, (n, t) in enumerate(zip(indices, texts))]
    tasks = {_typed(n, int, path, row, "task_index"): _typed(t, str, path, row, "task") for row, n, t in pairs}
    return tasks, str(path)


def _pandas_index_column(table: pa.Table, path: Path) -> str | None:
    """The column holding a pandas frame's index: LeRobot writes its tasks as a frame indexed by the task text, and
    pandas stores that index as a column its metadata (a JSON document) names, by default "__index_level_0__"."""
    raw = (table.schema.metadata or {}).get(b"pandas")
    index_columns: list = []
    if raw is not None:
        try:
            index_columns = json.loads(raw)["index_columns"]
        except (ValueError, KeyError, TypeError) as error:  # not JSON, or not pandas' object with index_columns
            raise DataError(str(path), None, None, f"expected pandas metadata with `index_columns` (it has no `task` "
                            f"column), found metadata it cannot read ({type(error).__name__}: {error})") from error
    return next((c for c in [*index_columns, "__index_level_0__"] if isinstance(c, str) and c in table.column_names),
                None)


def _read_episode_list(root: Path, version: str) -> tuple[dict[int, tuple[str, int, int]], str]:
    """episode_index -> (file, row, length) from the episode metadata, and where that is (for messages)."""
    if version == "v2.1":
        path = root / "meta" / "episodes.jsonl"
        sources = [(path, [(row, obj.get("episode_index"), obj.get("length")) for row, obj in _jsonl(path, root)])]
    else:
        files = sorted((root / "meta" / "episodes").glob("*/*.parquet"))
        if not files:
            raise DataError(str(root / "meta" / "episodes"), None, None,
                            "expected meta/episodes/chunk-*/file-*.parquet, found none")
        sources = []
        for path in files:
            table = _parquet(path, root)
            for name in ("episode_index", "length"):
                if name not in table.column_names:
                    raise DataError(str(path), None, name,
                                    f"expected a column {name!r}; the file has {table.column_names}")
            episodes, lengths = table.column("episode_index").to_pylist(), table.column("length").to_pylist()
            sources.append((path, [(i + 1, ep, n) for i, (ep, n) in enumerate(zip(episodes, lengths))]))
    listed = {_typed(ep, int, path, row, "episode_index"): (str(path), row, _typed(n, int, path, row, "length"))
              for path, rows in sources for row, ep, n in rows}
    return listed, "meta/episodes.jsonl" if version == "v2.1" else "meta/episodes/"


def _vector_dim(info_path: Path, features: dict, key: str) -> int:
    dtype, shape = features[key].get("dtype"), features[key].get("shape")
    if not str(dtype).startswith("float") or not _positive_ints(shape, 1):
        raise DataError(str(info_path), None, f"features.{key}",
                        f"expected dtype float32 and shape [n], found {dtype!r} and {shape!r}")
    return shape[0]


def _image_shape(info_path: Path, key: str, feature: dict) -> tuple[int, int, int]:
    shape = feature.get("shape")
    if not _positive_ints(shape, 3):
        raise DataError(str(info_path), None, f"features.{key}",
                        f"expected an image shape [height, width, channels], found {shape!r}")
    return tuple(shape)


def _decode(cell: Any, shape: tuple[int, int, int], path: Path, row: int, field: str) -> Image.Image:
    data = cell.get("bytes") if isinstance(cell, dict) else None
    if not isinstance(data, bytes):  # never follow a path: the dataset's files are all we read
        found = f"path {cell.get('path')!r} without bytes" if isinstance(cell, dict) else f"{cell!r:.80}"
        raise DataError(str(path), row, field,
                        f"expected an image embedded as struct{{bytes, path}} with PNG or JPEG bytes, found {found}")
    try:
        with Image.open(io.BytesIO(data), formats=_IMAGE_FORMATS) as image:
            width, height = image.size  # from the header: pixels are decoded only once both checks pass
            if width > MAX_IMAGE_SIDE or height > MAX_IMAGE_SIDE:
                raise DataError(str(path), row, field, f"expected an image of at most {MAX_IMAGE_SIDE}x"
                                f"{MAX_IMAGE_SIDE} pixels, found {width}x{height}")
            if (height, width) != shape[:2]:
                raise DataError(str(path), row, field, f"expected {shape[0]}x{shape[1]} pixels (height x width, "
                                f"from meta/info.json), found {height}x{width}")
            return image.convert("RGB")
    except (OSError, SyntaxError, Image.DecompressionBombError) as error:  # SyntaxError: PIL's broken PNG chunk
        raise DataError(str(path), row, field,
                        f"expected a PNG or JPEG image; the bytes did not decode ({error})") from error


def _vector(value: Any, dim: int, path: Path, row: int, field: str) -> np.ndarray:
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise DataError(str(path), row, field, f"expected a list of {dim} numbers, found {value!r:.80}")
    if len(value) != dim:
        raise DataError(str(path), row, field,
                        f"expected {dim} values (meta/info.json shape [{dim}]), found {len(value)}")
    array = np.asarray(value, dtype=np.float32)
    if not np.isfinite(array).all():
        raise DataError(str(path), row, field, f"expected finite numbers, found {value}")
    return array


def _typed(value: Any, kind: type, path: Path, row: int, field: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise DataError(str(path), row, field,
                        f"expected {'an integer' if kind is int else 'a string'}, found {value!r:.80}")
    return value


def _positive_ints(shape: Any, length: int) -> bool:
    return isinstance(shape, list) and len(shape) == length and all(isinstance(n, int) and n > 0 for n in shape)


def _parquet(path: Path, root: Path, *, columns: list[str] | None = None, schema_only: bool = False) -> Any:
    _check_file(path, root)
    try:
        return pq.read_schema(path) if schema_only else pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as error:
        raise DataError(str(path), None, None, f"expected a parquet file; it does not read ({error})") from error


def _check_file(path: Path, root: Path) -> None:
    """A DataError unless `path` is a regular file inside the dataset folder `root` (symlinks followed): a FIFO
    would block the read forever, /dev/zero never end, and a symlink out of the folder would read a file that is
    not the dataset's."""
    try:
        check_regular(path)
    except FileNotFoundError:
        dangling = f"is a symlink to nothing ({os.path.realpath(path)})" if os.path.islink(path) else "does not exist"
        raise DataError(str(path), None, None, f"expected this file of the LeRobot layout; it {dangling}") from None
    except InputFileError as error:
        raise DataError(str(path), None, None, f"{error}: a LeRobot dataset holds regular files") from None
    except OSError as error:  # no permission, a loop of symlinks
        raise DataError(str(path), None, None, f"cannot read it: {error.strerror or error}") from error
    target, inside = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([target, inside]) != inside:
        raise DataError(str(path), None, None, f"links out of the dataset folder (to {target}); a LeRobot dataset's "
                        "files are its own: copy that file into the folder")


def _text(path: Path, root: Path) -> str:
    _check_file(path, root)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DataError(str(path), None, None, f"expected UTF-8 text ({error.reason} at byte {error.start})") from error


def _load_json(path: Path, root: Path) -> dict:
    text = _text(path, root)
    if too_deep(text.encode("utf-8")):  # before `json`, which would recurse into it (RecursionError)
        raise DataError(str(path), None, None, TOO_DEEP)
    try:
        value = json.loads(text)
    except ValueError as error:
        raise DataError(str(path), None, None, f"expected a JSON object; it does not parse ({error})") from error
    if not isinstance(value, dict):
        raise DataError(str(path), None, None, f"expected a JSON object, found {type(value).__name__}")
    return value


def _jsonl(path: Path, root: Path) -> list[tuple[int, dict]]:
    rows = []
    for row, line in enumerate(_text(path, root).splitlines(), start=1):
        if too_deep(line.encode("utf-8")):  # before `json`, which would recurse into it (RecursionError)
            raise DataError(str(path), row, None, TOO_DEEP)
        try:
            obj = json.loads(line) if line.strip() else {}
        except ValueError as error:
            raise DataError(str(path), row, None,
                            f"expected a JSON object on each line; it does not parse ({error})") from error
        if not isinstance(obj, dict):
            raise DataError(str(path), row, None, f"expected a JSON object, found {type(obj).__name__}")
        if obj:
            rows.append((row, obj))
    return rows


# ------------------------------------------------------------------------------------------------ writing


def write_dataset(root: Path, episodes: list[EpisodeRecord], *, fps: int, robot_type: str = "unknown") -> Path:
    """Write `episodes` as a LeRobot v3.0 dataset at `root`, which must not exist or be empty; returns `root`.

    The files go into a temporary sibling folder renamed to `root` at the end, so that a failed write never
    leaves a folder that reads as a dataset.
    """
    root = Path(root)
    refuse_to_overwrite(root)
    if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
        raise ValueError(f"fps must be a positive integer, got {fps!r}")
    vectors, images = _check_records(episodes)
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{root.name}.", suffix=".partial", dir=root.parent))
    try:
        os.chmod(partial, 0o755)  # mkdtemp makes a private folder; a dataset is meant to be shared
        _write_layout(partial, episodes, vectors, images, fps, robot_type)
        os.rename(partial, root)  # atomic; it replaces only an empty folder, and fails on one filled meanwhile
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return root


def refuse_to_overwrite(root: Path) -> None:
    """FileExistsError unless `root` is absent or an empty folder: a dataset is never written over anything."""
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(errno.EEXIST, f"{root} exists and is not an empty folder; a dataset is never written "
                              "over anything", str(root))


def _check_records(episodes: list[EpisodeRecord]) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, int]]]:
    """All states and actions concatenated (float32 [N, dim] by feature key), and each camera's (height, width)."""
    if not episodes:
        raise ValueError("write_dataset needs at least one episode")
    first = episodes[0]
    with_state = first.states is not None
    # Padded shapes, so that a malformed first episode gives the shape messages below rather than an IndexError.
    sizes = {key: (np.shape(frames) + (0, 0, 0))[1:3] for key, frames in first.images.items()}
    dims = {_ACTION: (np.shape(first.actions) + (0, 0))[1]}
    if with_state:
        dims[_STATE] = (np.shape(first.states) + (0, 0))[1]
    vectors: dict[str, list[np.ndarray]] = {key: [] for key in dims}
    for i, record in enumerate(episodes):
        if not isinstance(record.task, str) or (record.states is not None) != with_state:
            raise ValueError(f"episode {i}: task must be a string, and states given for every episode or for none")
        length = np.shape(record.actions)[0] if np.ndim(record.actions) == 2 else 0
        for key, dim in dims.items():
            array = np.asarray(record.actions if key == _ACTION else record.states, np.float32)
            if length == 0 or array.shape != (length, dim) or not np.isfinite(array).all():
                raise ValueError(f"episode {i}: {key} must be finite float32 [T>0, {dim}], got shape {array.shape}")
            vectors[key].append(array)
        if set(record.images) != set(sizes):
            raise ValueError(f"episode {i}: cameras {sorted(record.images)} differ from episode 0's {sorted(sizes)}")
        for key, (height, width) in sizes.items():
            frames = np.asarray(record.images[key])
            if frames.dtype != np.uint8 or frames.shape != (length, height, width, 3):
                raise ValueError(f"episode {i}: images[{key!r}] must be uint8 [{length}, {height}, {width}, 3], "
                                 f"got {frames.dtype} {frames.shape}")
    for key in sizes:
        if not isinstance(key, str) or "/" in key or key in (_ACTION, _STATE, *_SCALARS):
            raise ValueError(f"camera key {key!r} must be a string without '/' and not a reserved feature name")
    return {key: np.concatenate(parts) for key, parts in vectors.items()}, sizes


def _write_layout(root: Path, episodes: list[EpisodeRecord], vectors: dict[str, np.ndarray],
                  sizes: dict[str, tuple[int, int]], fps: int, robot_type: str) -> None:
    task_ids: dict[str, int] = {}
    for record in episodes:
        task_ids.setdefault(record.task, len(task_ids))
    lengths = [len(record.actions) for record in episodes]
    bounds = np.cumsum([0, *lengths]).tolist()
    frame_index = np.concatenate([np.arange(n) for n in lengths])
    scalars = {"timestamp": frame_index / fps, "frame_index": frame_index,
               "episode_index": np.repeat(np.arange(len(episodes)), lengths), "index": np.arange(bounds[-1]),
               "task_index": np.repeat([task_ids[r.task] for r in episodes], lengths)}

    features, columns = {}, {}
    for key, values in vectors.items():
        features[key] = {"dtype": "float32", "shape": [values.shape[1]], "names": None}
        columns[key] = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1])
    for key, (height, width) in sizes.items():
        features[key] = {"dtype": "image", "shape": [height, width, 3], "names": ["height", "width", "channels"]}
        frames = [pixels for record in episodes for pixels in np.asarray(record.images[key])]
        cells = [{"bytes": _png(pixels), "path": None} for pixels in frames]
        columns[key] = pa.array(cells, _IMAGE_TYPE)
    for key, dtype in _SCALARS.items():
        features[key] = {"dtype": dtype, "shape": [1], "names": None}
        columns[key] = pa.array(scalars[key].astype(dtype))
    for folder in ("data/chunk-000", "meta/episodes/chunk-000"):
        (root / folder).mkdir(parents=True)
    pq.write_table(pa.table(columns), root / "data" / "chunk-000" / "file-000.parquet")

    # LeRobot reads tasks.parquet with pandas and finds a task by the frame's index; this pandas metadata makes
    # the text column that index, as a pandas-written file would.
    pandas_meta = {"index_columns": ["__index_level_0__"], "column_indexes": [], "columns": [
        {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64"},
        {"name": None, "field_name": "__index_level_0__", "pandas_type": "unicode", "numpy_type": "object"}]}
    tasks = pa.table({"task_index": pa.array(list(task_ids.values()), pa.int64()), "__index_level_0__": list(task_ids)})
    pq.write_table(tasks.replace_schema_metadata({"pandas": json.dumps(pandas_meta)}), root / "meta" / "tasks.parquet")

    count, zeros = len(episodes), [0] * len(episodes)
    pq.write_table(pa.table({
        "episode_index": pa.array(range(count), pa.int64()), "tasks": [[r.task] for r in episodes],
        "length": pa.array(lengths, pa.int64()), "data/chunk_index": zeros, "data/file_index": zeros,
        "dataset_from_index": bounds[:-1], "dataset_to_index": bounds[1:],
        "meta/episodes/chunk_index": zeros, "meta/episodes/file_index": zeros,
    }), root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")

    stats = {key: _stats(values) for key, values in vectors.items()}
    stats |= {key: _image_stats([record.images[key] for record in episodes]) for key in sizes}
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=2))
    info = {"codebase_version": "v3.0", "robot_type": robot_type, "total_episodes": count, "total_frames": bounds[-1],
            "total_tasks": len(task_ids), "chunks_size": 1000, "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200, "fps": fps, "splits": {"train": f"0:{count}"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", "video_path": None,
            "features": features}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _image_stats(episodes: list[np.ndarray]) -> dict[str, list]:
    """A camera's statistics as LeRobot keeps them: per channel, over every pixel of every frame scaled to [0, 1],
    each shaped [3, 1, 1] (a policy normalising its images reads them, e.g. LeRobot's ACT)."""
    total, squares, count, frames_seen = np.zeros(3), np.zeros(3), 0, 0
    low, high = np.full(3, 255), np.zeros(3, dtype=np.int64)
    for frames in episodes:  # [T, H, W, 3] uint8, an episode at a time: the sums stay exact in float64
        pixels = np.asarray(frames).reshape(-1, 3)
        total += pixels.sum(0, dtype=np.float64)
        squares += np.square(pixels, dtype=np.float64).sum(0)
        low, high, count = np.minimum(low, pixels.min(0)), np.maximum(high, pixels.max(0)), count + len(pixels)
        frames_seen += len(frames)
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    stats = {"min": low / 255, "max": high / 255, "mean": mean / 255, "std": std / 255}
    return {key: value.reshape(3, 1, 1).tolist() for key, value in stats.items()} | {"count": [frames_seen]}


def _stats(values: np.ndarray) -> dict[str, list]:
    values = values.astype(np.float64)
    stats = {"min": values.min(0), "max": values.max(0), "mean": values.mean(0), "std": values.std(0)}
    stats |= {f"q{q:02d}": np.quantile(values, q / 100, axis=0) for q in (1, 10, 50, 90, 99)}  # LeRobot's quantiles
    return {key: value.tolist() for key, value in stats.items()} | {"count": [len(values)]}
