"""oxrl.vla.lerobot: the LeRobot layout written and read back, a hand-written v2.1 layout, and every refusal."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from oxrl.data.errors import DataError
from oxrl.vla import lerobot
from oxrl.vla.lerobot import EpisodeRecord, read_dataset, write_dataset

DATA_FILE = "data/chunk-000/file-000.parquet"


def _episodes(seed: int = 0, states: bool = True) -> list[EpisodeRecord]:
    """Two episodes (3 and 5 frames), two cameras of different sizes, distinct values everywhere."""
    rng = np.random.default_rng(seed)
    records = []
    for length, task in ((3, "pick up the red cube"), (5, "open the drawer")):
        records.append(EpisodeRecord(
            task=task,
            images={"observation.images.top": rng.integers(0, 256, (length, 8, 8, 3), dtype=np.uint8),
                    "observation.images.wrist": rng.integers(0, 256, (length, 16, 12, 3), dtype=np.uint8)},
            states=rng.normal(size=(length, 4)).astype(np.float32) if states else None,
            actions=rng.normal(size=(length, 3)).astype(np.float32),
        ))
    return records


def _assert_same(dataset, records: list[EpisodeRecord]) -> None:
    assert [e.index for e in dataset.episodes] == list(range(len(records)))
    for episode, record in zip(dataset.episodes, records, strict=True):
        assert episode.task == record.task
        assert [f.index for f in episode.frames] == list(range(len(record.actions)))
        for t, frame in enumerate(episode.frames):
            assert frame.action.dtype == np.float32
            np.testing.assert_array_equal(frame.action, record.actions[t])
            if record.states is None:
                assert frame.state is None
            else:
                np.testing.assert_array_equal(frame.state, record.states[t])
            assert list(frame.images) == list(record.images)
            for key, image in frame.images.items():
                assert image.mode == "RGB"
                np.testing.assert_array_equal(np.asarray(image), record.images[key][t])


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _edit_rows(path: Path, edit) -> None:
    """Rewrite a parquet file after `edit(rows)` changes its rows (a list of dicts) in place; vectors become
    variable-length lists, so that a row can hold the wrong number of values."""
    table = pq.read_table(path)
    rows = table.to_pylist()
    edit(rows)
    schema = pa.schema([pa.field(f.name, pa.list_(f.type.value_type)) if pa.types.is_fixed_size_list(f.type) else f
                        for f in table.schema])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def _edit_info(root: Path, edit) -> None:
    path = root / "meta" / "info.json"
    info = json.loads(path.read_text())
    edit(info)
    path.write_text(json.dumps(info))


@pytest.fixture
def written(tmp_path) -> Path:
    return write_dataset(tmp_path / "ds", _episodes(), fps=10)


# ----------------------------------------------------------------------------------------- round trips


def test_write_then_read_is_the_same(written):
    dataset = read_dataset(written)
    assert (dataset.version, dataset.fps, dataset.root) == ("v3.0", 10, written)
    assert dataset.image_keys == ["observation.images.top", "observation.images.wrist"]
    assert dataset.image_shapes == {"observation.images.top": (8, 8, 3), "observation.images.wrist": (16, 12, 3)}
    assert (dataset.state_dim, dataset.action_dim) == (4, 3)
    _assert_same(dataset, _episodes())


def test_without_state(tmp_path):
    records = _episodes(seed=1, states=False)
    dataset = read_dataset(write_dataset(tmp_path / "ds", records, fps=5))
    assert dataset.state_dim is None
    _assert_same(dataset, records)


def test_actions_are_every_frame_in_order(written):
    records = _episodes()
    actions = read_dataset(written).actions()
    assert actions.shape == (8, 3) and actions.dtype == np.float32
    np.testing.assert_array_equal(actions, np.concatenate([r.actions for r in records]))


def test_written_files_follow_the_v30_layout(written):
    info = json.loads((written / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"], info["fps"]) == (2, 8, 2, 10)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["features"]["observation.images.top"] == {
        "dtype": "image", "shape": [8, 8, 3], "names": ["height", "width", "channels"]}
    assert info["features"]["action"]["shape"] == [3]
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert info["features"][key]["shape"] == [1]

    data = pq.read_table(written / DATA_FILE)
    assert data.schema.field("observation.images.top").type == pa.struct(
        [("bytes", pa.binary()), ("path", pa.string())])
    cell = data.column("observation.images.top")[0].as_py()
    assert cell["path"] is None and cell["bytes"].startswith(b"\x89PNG")
    assert data.column("index").to_pylist() == list(range(8))
    assert data.column("episode_index").to_pylist() == [0] * 3 + [1] * 5
    assert data.column("timestamp").to_pylist()[3:5] == pytest.approx([0.0, 0.1])

    episodes = pq.read_table(written / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [(e["episode_index"], e["tasks"], e["length"], e["dataset_from_index"], e["dataset_to_index"],
             e["data/chunk_index"], e["data/file_index"]) for e in episodes] == [
        (0, ["pick up the red cube"], 3, 0, 3, 0, 0), (1, ["open the drawer"], 5, 3, 8, 0, 0)]

    stats = json.loads((written / "meta" / "stats.json").read_text())
    actions = np.concatenate([r.actions for r in _episodes()]).astype(np.float64)
    assert stats["action"]["count"] == [8]
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0))
    np.testing.assert_allclose(stats["action"]["q01"], np.quantile(actions, 0.01, axis=0))
    assert set(stats["observation.state"]) >= {"min", "max", "mean", "std", "count", "q01", "q99"}
    # a camera's: per channel over every pixel in [0, 1], each [3, 1, 1], as LeRobot's policies read them
    pixels = np.concatenate([np.asarray(r.images["observation.images.top"]) for r in _episodes()]).reshape(-1, 3) / 255
    camera = stats["observation.images.top"]
    assert camera["count"] == [8] and np.asarray(camera["mean"]).shape == (3, 1, 1)
    for key, value in {"min": pixels.min(0), "max": pixels.max(0), "mean": pixels.mean(0), "std": pixels.std(0)}.items():
        np.testing.assert_allclose(np.asarray(camera[key]).ravel(), value, rtol=1e-9, atol=1e-12)


def test_tasks_parquet_reads_as_lerobot_reads_it(written):
    pandas = pytest.importorskip("pandas")
    tasks = pandas.read_parquet(written / "meta" / "tasks.parquet")
    # LeRobot: task_index = tasks.loc[task].task_index, task = tasks.iloc[task_index].name
    assert int(tasks.loc["open the drawer"].task_index) == 1
    assert tasks.iloc[0].name == "pick up the red cube"


def _retitle_tasks(root: Path, metadata: bytes | None, text_column: str = "__index_level_0__") -> None:
    """tasks.parquet with its task-text column renamed and its pandas metadata replaced (None: removed)."""
    path = root / "meta" / "tasks.parquet"
    table = pq.read_table(path)
    table = table.rename_columns([name if name == "task_index" else text_column for name in table.column_names])
    pq.write_table(table.replace_schema_metadata(None if metadata is None else {b"pandas": metadata}), path)


def _tasks(root: Path) -> list[str]:
    return sorted({episode.task for episode in read_dataset(root).episodes})


def test_the_task_text_is_found_by_pandas_metadata_or_by_name(written):
    _retitle_tasks(written, json.dumps({"index_columns": ["text"]}).encode(), text_column="text")
    assert _tasks(written) == ["open the drawer", "pick up the red cube"]
    _retitle_tasks(written, None, text_column="task")  # a plain `task` column needs no metadata
    assert _tasks(written) == ["open the drawer", "pick up the red cube"]
    _retitle_tasks(written, None, text_column="text")  # neither: the error names what it looked for
    _raises(written, "tasks.parquet: expected columns task_index and task (or a pandas index holding the task)")


@pytest.mark.parametrize("metadata", [b"{not json", b"[1, 2]", b'{"columns": []}'])
def test_unreadable_pandas_metadata_is_named_when_the_task_text_depends_on_it(written, metadata):
    _retitle_tasks(written, metadata, text_column="text")
    _raises(written, "tasks.parquet: expected pandas metadata with `index_columns`")
    _retitle_tasks(written, metadata, text_column="task")  # beside a `task` column the metadata is not read
    assert _tasks(written) == ["open the drawer", "pick up the red cube"]


def _write_v21(root: Path, records: list[EpisodeRecord]) -> None:
    """The v2.1 layout, written here independently of the module: one parquet file per episode, jsonl metadata,
    variable-length float64 lists."""
    (root / "meta").mkdir(parents=True)
    features = {"action": {"dtype": "float32", "shape": [3], "names": None},
                "observation.state": {"dtype": "float32", "shape": [4], "names": None}}
    for key, frames in records[0].images.items():
        features[key] = {"dtype": "image", "shape": list(frames.shape[1:]), "names": ["height", "width", "channel"]}
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        features[key] = {"dtype": "float32" if key == "timestamp" else "int64", "shape": [1], "names": None}
    info = {"codebase_version": "v2.1", "robot_type": "so100", "total_episodes": len(records), "fps": 30,
            "chunks_size": 1000, "total_chunks": 1, "total_videos": 0, "splits": {"train": "0:2"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": None, "features": features}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    tasks = sorted({r.task for r in records})  # task indices in another order than the episodes
    (root / "meta" / "tasks.jsonl").write_text(
        "".join(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(tasks)))
    (root / "meta" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_index": i, "tasks": [r.task], "length": len(r.actions)}) + "\n"
        for i, r in enumerate(records)))
    (root / "data" / "chunk-000").mkdir(parents=True)
    index = 0
    for ep, record in enumerate(records):
        rows = []
        for t in reversed(range(len(record.actions))):  # stored out of order: the reader orders by frame_index
            rows.append({"action": record.actions[t].astype(np.float64).tolist(),
                         "observation.state": record.states[t].tolist(),
                         **{k: {"bytes": _png(v[t]), "path": f"frame_{t}.png"} for k, v in record.images.items()},
                         "timestamp": t / 30, "frame_index": t, "episode_index": ep, "index": index + t,
                         "task_index": tasks.index(record.task)})
        index += len(record.actions)
        pq.write_table(pa.Table.from_pylist(rows), root / "data" / "chunk-000" / f"episode_{ep:06d}.parquet")


def test_reads_a_v21_layout(tmp_path):
    records = _episodes(seed=2)
    _write_v21(tmp_path / "v21", records)
    dataset = read_dataset(tmp_path / "v21")
    assert (dataset.version, dataset.fps, dataset.state_dim, dataset.action_dim) == ("v2.1", 30, 4, 3)
    assert dataset.image_shapes["observation.images.wrist"] == (16, 12, 3)
    _assert_same(dataset, records)


# ----------------------------------------------------------------------------------------- writing safely


def test_refuses_to_overwrite(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="exists and is not an empty folder"):
        write_dataset(root, _episodes(), fps=10)
    assert [p.name for p in root.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_writes_into_an_empty_folder(tmp_path):
    (tmp_path / "ds").mkdir()
    assert len(read_dataset(write_dataset(tmp_path / "ds", _episodes(), fps=10)).episodes) == 2


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def failing_write(table, where, **kwargs):
        calls.append(where)
        if len(calls) == 2:
            raise OSError("disk full")
        return pq.write_table(table, where, **kwargs)

    monkeypatch.setattr(lerobot.pq, "write_table", failing_write)
    with pytest.raises(OSError, match="disk full"):
        write_dataset(tmp_path / "ds", _episodes(), fps=10)
    assert len(calls) == 2
    assert list(tmp_path.iterdir()) == []


def test_rejects_inconsistent_records(tmp_path):
    records = _episodes()
    records[1].actions = records[1].actions[:, :2]
    with pytest.raises(ValueError, match=r"episode 1: action must be finite float32 \[T>0, 3\], got shape \(5, 2\)"):
        write_dataset(tmp_path / "ds", records, fps=10)
    assert not (tmp_path / "ds").exists()


# ----------------------------------------------------------------------------------------- refusals


def _raises(root: Path, *parts: str) -> DataError:
    with pytest.raises(DataError) as caught:
        read_dataset(root)
    for part in parts:
        assert part in str(caught.value), str(caught.value)
    return caught.value


def test_folder_without_info_json(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "readme.md").write_text("x")
    _raises(tmp_path, f"{tmp_path}: not a LeRobot dataset folder: expected meta/info.json",
            "contains ['data', 'readme.md']")


def test_unsupported_version(written):
    _edit_info(written, lambda info: info.update(codebase_version="v2.0"))
    _raises(written, "info.json, field 'codebase_version'", "expected one of ['v2.1', 'v3.0']", "found 'v2.0'")


def test_video_features_are_refused_before_any_frame_is_read(written):
    def to_video(info):
        info["features"]["observation.images.top"]["dtype"] = "video"
    _edit_info(written, to_video)
    (written / DATA_FILE).write_bytes(b"not parquet")  # never opened: the refusal comes first
    _raises(written, "field 'features.observation.images.top'", "need a video decoder, which oxRL does not read",
            "video=False")


def test_missing_action_feature(written):
    _edit_info(written, lambda info: info["features"].pop("action"))
    _raises(written, "info.json, field 'features': expected an 'action' feature")


def test_data_file_missing_a_column(written):
    path = written / DATA_FILE
    pq.write_table(pq.read_table(path).drop_columns(["observation.state"]), path)
    _raises(written, "file-000.parquet, field 'observation.state': expected the column 'observation.state' named in "
            "meta/info.json features")


def test_action_of_the_wrong_length(written):
    _edit_rows(written / DATA_FILE, lambda rows: rows[1].update(action=[0.1, 0.2]))
    _raises(written, "file-000.parquet, row 2, field 'action': expected 3 values (meta/info.json shape [3]), found 2")


def test_non_finite_state(written):
    def poison(rows):
        rows[4]["observation.state"][2] = float("nan")
    _edit_rows(written / DATA_FILE, poison)
    _raises(written, "file-000.parquet, row 5, field 'observation.state': expected finite numbers", "nan")


def test_non_finite_action(written):
    def poison(rows):
        rows[0]["action"][0] = float("inf")
    _edit_rows(written / DATA_FILE, poison)
    _raises(written, "file-000.parquet, row 1, field 'action': expected finite numbers", "inf")


def test_image_that_does_not_decode(written):
    _edit_rows(written / DATA_FILE, lambda rows: rows[2].update(
        {"observation.images.wrist": {"bytes": b"\x89PNG garbage", "path": None}}))
    _raises(written, "file-000.parquet, row 3, field 'observation.images.wrist': expected a PNG or JPEG image; "
            "the bytes did not decode")


def test_image_of_the_wrong_size(written):
    small = _png(np.zeros((4, 8, 3), np.uint8))
    _edit_rows(written / DATA_FILE, lambda rows: rows[6].update(
        {"observation.images.top": {"bytes": small, "path": None}}))
    _raises(written, "row 7, field 'observation.images.top': expected 8x8 pixels (height x width, from "
            "meta/info.json), found 4x8")


def test_image_larger_than_the_bound(written):
    def widen(info):
        info["features"]["observation.images.top"]["shape"] = [1, 5000, 3]
    _edit_info(written, widen)  # the size agrees with info.json: only the bound refuses it
    wide = _png(np.zeros((1, 5000, 3), np.uint8))
    _edit_rows(written / DATA_FILE, lambda rows: [row.update(
        {"observation.images.top": {"bytes": wide, "path": None}}) for row in rows])
    _raises(written, "row 1, field 'observation.images.top': expected an image of at most 4096x4096 pixels, "
            "found 5000x1")


def test_image_given_as_a_path_only(written):
    _edit_rows(written / DATA_FILE, lambda rows: rows[0].update(
        {"observation.images.top": {"bytes": None, "path": "/etc/passwd"}}))
    _raises(written, "row 1, field 'observation.images.top': expected an image embedded as struct{bytes, path}",
            "path '/etc/passwd' without bytes")


def test_frame_indices_not_0_to_t_minus_1(written):
    _edit_rows(written / DATA_FILE, lambda rows: rows[4].update(frame_index=7))  # episode 1 becomes 0, 2, 3, 4, 7
    _raises(written, "file-000.parquet, row 5, field 'frame_index': expected the frame_index values of episode 1 "
            "to be 0..4, found [0, 2, 3, 4, 7]")


def test_task_index_not_in_the_tasks_table(written):
    _edit_rows(written / DATA_FILE, lambda rows: rows[5].update(task_index=9))
    _raises(written, "file-000.parquet, row 6, field 'task_index': expected a task_index listed in",
            "tasks.parquet ([0, 1]), found 9")


def test_episode_without_metadata(written):
    def move(rows):
        for row in rows[3:]:
            row["episode_index"] = 4
    _edit_rows(written / DATA_FILE, move)
    _raises(written, "file-000.parquet, row 4, field 'episode_index': expected every episode_index to be listed in "
            "meta/episodes/; episode 4 is not")


def test_listed_episode_without_frames(written):
    _edit_rows(written / DATA_FILE, lambda rows: rows.__delitem__(slice(0, 3)))  # episode 0's frames
    _raises(written, "meta/episodes/chunk-000/file-000.parquet, row 1, field 'episode_index': expected frames of "
            "episode 0 in data/, found none")


def test_episode_with_two_tasks(written):
    _edit_rows(written / DATA_FILE, lambda rows: rows[7].update(task_index=0))
    _raises(written, "file-000.parquet, row 4, field 'task_index': expected one task per episode",
            "episode 1 has task_index values [0, 1]")


def test_episode_length_disagrees_with_metadata(written):
    _edit_rows(written / "meta/episodes/chunk-000/file-000.parquet", lambda rows: rows[0].update(length=4))
    _raises(written, "meta/episodes/chunk-000/file-000.parquet, row 1, field 'length': expected 3 (the frames of "
            "episode 0 in data/), found 4")


def test_v21_errors_name_the_jsonl_line(tmp_path):
    root = tmp_path / "v21"
    _write_v21(root, _episodes())
    with (root / "meta" / "tasks.jsonl").open("a") as f:
        f.write(json.dumps({"task_index": "two", "task": "x"}) + "\n")
    _raises(root, "tasks.jsonl, row 3, field 'task_index': expected an integer, found 'two'")


def test_data_file_that_is_not_parquet(written):
    (written / DATA_FILE).write_bytes(b"PAR1 but not really")
    _raises(written, "file-000.parquet: expected a parquet file; it does not read")


def test_missing_tasks_table(written):
    (written / "meta" / "tasks.parquet").unlink()
    _raises(written, "tasks.parquet: expected this file of the LeRobot layout; it does not exist")


def test_info_json_that_does_not_parse(written):
    (written / "meta" / "info.json").write_text("{not json")
    _raises(written, "info.json: expected a JSON object; it does not parse")


def test_rejects_images_of_the_wrong_type(tmp_path):
    records = _episodes()
    records[0].images["observation.images.top"] = records[0].images["observation.images.top"].astype(np.float32)
    with pytest.raises(ValueError, match=r"episode 0: images\['observation.images.top'\] must be uint8 \[3, 8, 8, 3\]"):
        write_dataset(tmp_path / "ds", records, fps=10)


def test_only_png_and_jpeg_are_decoded(written):
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buffer, format="BMP")  # a valid image, of another format
    _edit_rows(written / DATA_FILE, lambda rows: rows[0].update(
        {"observation.images.top": {"bytes": buffer.getvalue(), "path": None}}))
    _raises(written, "row 1, field 'observation.images.top': expected a PNG or JPEG image; the bytes did not decode")


# ----------------------------------------------------------------------------------------- hostile files


def test_json_nested_too_deep_is_refused_before_a_parser_recurses_into_it(tmp_path):
    root = tmp_path / "v21"
    _write_v21(root, _episodes())
    deep = "[" * 200_000 + "]" * 200_000  # json raises RecursionError near 1,000 levels
    with (root / "meta" / "tasks.jsonl").open("a") as f:
        f.write(json.dumps({"task_index": 5, "task": "x"}).replace("5", deep) + "\n")
    _raises(root, "meta/tasks.jsonl, row 3: its arrays and objects nest more than 100 levels deep")
    info = json.loads((root / "meta" / "info.json").read_text())
    (root / "meta" / "info.json").write_text(json.dumps({**info, "robot_type": "X"}).replace('"X"', deep))
    _raises(root, "meta/info.json: its arrays and objects nest more than 100 levels deep")


@pytest.mark.parametrize("file", ["meta/info.json", "meta/tasks.parquet", DATA_FILE])
def test_a_fifo_in_the_dataset_is_refused_at_once_as_what_it_is(written, file):
    from tests.hostile_files import make_fifo, raised_within

    (written / file).unlink()
    fifo = make_fifo(written / file)  # reading it would wait for a writer forever
    error = raised_within(20, lambda: read_dataset(written), [fifo])
    assert isinstance(error, DataError)
    assert str(error) == f"{fifo}: is a FIFO (named pipe), not a regular file: a LeRobot dataset holds regular files"


def test_a_symlink_to_a_device_in_the_dataset_names_what_it_links_to(written):
    (written / "meta" / "tasks.parquet").unlink()
    (written / "meta" / "tasks.parquet").symlink_to("/dev/null")  # a device, as /dev/zero is, but that ends at once
    _raises(written, r"tasks.parquet: is a character device (a symlink to /dev/null), not a regular file")


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_a_data_file_that_links_out_of_the_dataset_folder_is_refused(tmp_path, written, linked):
    """A data file (or its chunk folder) that is a symlink to a file outside the dataset is not the dataset's."""
    outside = tmp_path / "elsewhere"
    (outside / "chunk-000").mkdir(parents=True)
    (written / DATA_FILE).rename(outside / "chunk-000" / "file-000.parquet")
    if linked == "file":
        (written / DATA_FILE).symlink_to(outside / "chunk-000" / "file-000.parquet")
    else:
        (written / "data" / "chunk-000").rmdir()
        (written / "data" / "chunk-000").symlink_to(outside / "chunk-000")
    _raises(written, f"{DATA_FILE}: links out of the dataset folder (to {outside / 'chunk-000' / 'file-000.parquet'}); "
            "a LeRobot dataset's files are its own")
    (written / "data" / "chunk-000").unlink() if linked == "folder" else (written / DATA_FILE).unlink()
    if linked == "folder":
        (written / "data" / "chunk-000").mkdir()
    (written / DATA_FILE).symlink_to(Path("..") / ".." / "meta" / ".." / "data" / "real.parquet")  # inside: read
    (outside / "chunk-000" / "file-000.parquet").rename(written / "data" / "real.parquet")
    assert len(read_dataset(written).episodes) == 2
