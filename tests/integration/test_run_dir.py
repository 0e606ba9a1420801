"""The run directory: one run at a time, no silent clobbering, honest resume, one-line write errors.

Runs go through `oxrl train` (tests/integration/test_runner.py's tiny model and chat file: ~2 s a run).
"""

import errno
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from oxrl.cli import main
from oxrl.config.load import ConfigError, load_config
from oxrl.config.schema import Config
from oxrl.training.checkpoint import latest_checkpoint, step_of
from oxrl.training.folders import OutputWriteError, as_write_error
from oxrl.training.optim import lr_factor
from oxrl.training.resume_check import config_changes
from oxrl.training.strategy import SingleDevice
from oxrl.runner import claimed_run
from tests.integration.test_runner import _write_config, tiny_model_dir  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
NAME_PATTERN = re.compile(r"sft-\d{8}-\d{6}-[0-9a-f]{4}")


def _rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def errors():
    """The messages `oxrl` logs at ERROR level during the test (the `oxrl` logger does not propagate)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(logging.ERROR)
    logging.getLogger("oxrl").addHandler(handler)
    yield messages
    logging.getLogger("oxrl").removeHandler(handler)


def _snapshot(run) -> dict:
    """Every file of a run directory and its bytes."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_second_process_on_a_locked_run_directory_fails_naming_the_holder(tmp_path, tiny_model_dir, errors):
    config = _write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from oxrl.training.run_dir import RunLock; "
         f"RunLock({str(run)!r}).acquire(); print('locked', flush=True); sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main(["train", str(config)]) == 2
        assert any(f"in use by process {holder.pid}" in message for message in errors), errors
        assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()  # no clean-up code runs: the OS releases the lock
        holder.wait()
    assert main(["train", str(config)]) == 0
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4]


def test_an_existing_run_is_refused_intact_and_overwrite_replaces_it(tmp_path, tiny_model_dir, errors):
    config = _write_config(tmp_path, tiny_model_dir, checkpoint={"every": 2, "keep_last": 3})
    run = tmp_path / "runs" / "tiny"
    assert main(["train", str(config), "train.max_steps=8"]) == 0
    (run / "notes.txt").write_text("mine")
    before = _snapshot(run)

    assert main(["train", str(config), "train.max_steps=3", "run.seed=1"]) == 2
    [message] = errors
    assert str(run) in message and "run.resume=true" in message and "run.overwrite=true" in message
    assert _snapshot(run) == before  # config.yaml, metrics, checkpoints: all as they were

    assert main(["train", str(config), "train.max_steps=3", "run.seed=1", "run.overwrite=true"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002", "step_000003"]
    assert [r["step"] for r in _rows(run)] == [1, 2, 3]
    assert "seed: 1" in (run / "config.yaml").read_text()
    assert (run / "notes.txt").read_text() == "mine"  # only what a run writes is cleared
    assert step_of(latest_checkpoint(run)) == 3  # a later resume continues the new run, not the old step 8


def test_unnamed_runs_get_their_own_directories(tmp_path):
    cfg = Config.model_validate({"run": {"output_dir": str(tmp_path)}, "model": {"name_or_path": "m"},
                                 "algorithm": {"name": "sft"}})
    strategy = SingleDevice(torch.device("cpu"), "no")
    with claimed_run(cfg, strategy) as (first, first_dir), claimed_run(cfg, strategy) as (second, second_dir):
        assert NAME_PATTERN.fullmatch(first.run.name) and NAME_PATTERN.fullmatch(second.run.name)
        assert first_dir != second_dir and first_dir == tmp_path / first.run.name
        assert first_dir.is_dir() and second_dir.is_dir()
    assert cfg.run.name is None  # the caller's config is left as it was


def test_resume_true_needs_a_run_name():
    base = {"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}, "run": {"resume": True}}
    with pytest.raises(ConfigError, match="run.resume: true continues the run named by run.name"):
        load_config(None, base=base)
    with pytest.raises(ConfigError, match="set only one"):
        load_config(None, ["run.name=x", "run.overwrite=true"], base=base)


def test_resume_with_a_changed_config_is_refused_then_accepted_with_the_new_lr(tmp_path, tiny_model_dir, errors):
    config = _write_config(tmp_path, tiny_model_dir, checkpoint={"every": 2, "keep_last": 3})
    run = tmp_path / "runs" / "tiny"
    assert main(["train", str(config)]) == 0
    saved_config = (run / "config.yaml").read_bytes()
    changed = [str(config), "run.resume=true", "train.max_steps=6", "train.optim.lr=5e-4", "logging.progress_bar=true"]

    assert main(["train", *changed]) == 2
    [message] = errors
    assert "train.optim.lr: 0.001 -> 0.0005" in message and "train.max_steps: 4 -> 6" in message
    assert "progress_bar" not in message and "-> true" not in message  # nor run.resume: keys that cannot matter
    assert "run.accept_config_changes=true" in message
    assert (run / "config.yaml").read_bytes() == saved_config

    assert main(["train", *changed, "run.accept_config_changes=true"]) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    optim = load_config(config, ["train.optim.lr=5e-4"]).train.optim
    for row in rows[4:]:  # the new peak lr and the new 6-step schedule, not the checkpoint's
        assert row["lr"] == pytest.approx(5e-4 * lr_factor(row["step"] - 1, 6, optim), rel=1e-12)
    assert rows[0]["lr"] == pytest.approx(1e-3 * lr_factor(0, 4, optim), rel=1e-12)
    assert "lr: 0.0005" in (run / "config.yaml").read_text()


def test_rewinding_a_run_keeps_one_metrics_row_per_step(tmp_path, tiny_model_dir):
    """As after a kill between logging step 3 and checkpointing it: resume from step 2 of the same run."""
    config = _write_config(tmp_path, tiny_model_dir, checkpoint={"every": 2, "keep_last": 3})
    run = tmp_path / "runs" / "tiny"
    assert main(["train", str(config)]) == 0
    first = _rows(run)
    checkpoint = run / "checkpoints" / "step_000002"
    assert main(["train", str(config), f"run.resume={checkpoint}"]) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for a, b in zip(first, rows):  # the rewound steps are recomputed exactly
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


def test_overwrite_cannot_delete_the_checkpoint_it_resumes_from(tmp_path, tiny_model_dir, errors):
    config = _write_config(tmp_path, tiny_model_dir)
    run = tmp_path / "runs" / "tiny"
    assert main(["train", str(config)]) == 0
    checkpoint = run / "checkpoints" / "step_000004"
    assert main(["train", str(config), f"run.resume={checkpoint}", "run.overwrite=true"]) == 2
    assert "set only one" in errors[0] and checkpoint.is_dir()


def test_an_output_dir_that_is_a_file_is_one_line_exit_2(tmp_path, tiny_model_dir, errors):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    config = _write_config(tmp_path, tiny_model_dir)
    assert main(["train", str(config), f"run.output_dir={blocker}"]) == 2
    [message] = errors
    assert str(blocker) in message and "not a directory" in message and "\n" not in message


TORCH_DISK_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"


@pytest.mark.parametrize("failure, reason", [
    (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    (OSError(errno.EROFS, "Read-only file system"), "Read-only file system"),
    (RuntimeError(TORCH_DISK_FULL), "write failed"),  # torch's message: no errno, no path
])
def test_a_checkpoint_write_that_fails_leaves_no_partial_folder(tmp_path, tiny_model_dir, errors, monkeypatch,
                                                                failure, reason):
    config = _write_config(tmp_path, tiny_model_dir, checkpoint={"every": 2, "keep_last": 3})
    real_save = torch.save

    def save_failing_at_step_4(obj, path, *args, **kwargs):
        if "step_000004" in str(path):
            raise failure
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_failing_at_step_4)
    assert main(["train", str(config)]) == 2
    checkpoints = tmp_path / "runs" / "tiny" / "checkpoints"
    [message] = errors
    assert message.startswith(f"could not write {checkpoints / 'step_000004'}: {reason}") and "\n" not in message
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000002"]  # no partial folder
    assert step_of(checkpoints / "step_000002") == 2  # the previous checkpoint is intact


def test_a_final_folder_that_fails_leaves_neither_partial_nor_final(tmp_path, tiny_model_dir, errors, monkeypatch):
    import oxrl.models.save

    def fill_the_disk(model, tokenizer, out_dir, lora_save="merged"):
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(oxrl.models.save, "save_hf_folder", fill_the_disk)
    assert main(["train", str(_write_config(tmp_path, tiny_model_dir))]) == 2
    run = tmp_path / "runs" / "tiny"
    assert errors == [f"could not write {run / 'final'}: No space left on device"]
    assert not (run / "final").exists() and not (run / ".final.partial").exists()


def test_write_errors_are_recognised_and_others_are_not(tmp_path):
    safetensors_full = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    wrapped = as_write_error(safetensors_full, tmp_path / "final")
    assert isinstance(wrapped, OSError) and wrapped.errno == errno.ENOSPC
    assert str(wrapped) == f"could not write {tmp_path / 'final'}: No space left on device"
    assert as_write_error(RuntimeError("shape mismatch"), tmp_path) is None  # a bug stays a bug
    assert isinstance(as_write_error(OSError(errno.EROFS, "Read-only file system"), tmp_path), OutputWriteError)


def test_config_changes_lists_each_differing_key():
    saved = {"run": {"name": "a", "seed": 0}, "train": {"optim": {"lr": 1e-3}}, "data": {"train": [{"path": "x"}]}}
    new = {"run": {"name": "b", "seed": 0}, "train": {"optim": {"lr": 5e-4}}, "data": {"train": [{"path": "y"}]},
           "rl": {"task": None}}
    assert config_changes(saved, new) == ['data.train: [{"path": "x"}] -> [{"path": "y"}]', "train.optim.lr: 0.001 -> 0.0005"]
    # A setting absent from the saved config is one added to oxRL after that run was saved: no change at its default
    # (rl.task: null), a change at any other value.
    assert config_changes(saved, {**new, "rl": {"task": "countdown"}})[1] == 'rl.task: (not set) -> "countdown"'


def test_a_run_saved_before_a_setting_existed_resumes_at_that_settings_default():
    from oxrl.config.load import saved_form

    cfg = Config.model_validate({"model": {"name_or_path": "m"}, "algorithm": {"name": "grpo"}, "rl": {"task": "math"}})
    saved = saved_form(cfg)
    for section, key in (("run", "push_to_hub"), ("run", "hub_private"), ("checkpoint", "on_signal"),
                         ("ray", "trainer_restarts"), ("ray", "node_wait_s")):
        del saved[section][key]  # as a config.yaml written before these settings existed
    assert config_changes(saved, saved_form(cfg)) == []
    changed = saved_form(cfg.model_copy(update={"run": cfg.run.model_copy(update={"push_to_hub": True})}))
    assert config_changes(saved, changed) == ["run.push_to_hub: (not set) -> true"]


@pytest.mark.distributed
def test_under_torchrun_every_rank_gets_rank_0s_name_and_its_refusal(tmp_path):
    from tests.system.test_distributed import torchrun

    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "config.yaml").write_text("run: {}\n")
    torchrun(["-m", "tests.run_dir_worker", str(tmp_path)], timeout=180)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert NAME_PATTERN.fullmatch(rank0["name"]) and rank1["name"] == rank0["name"]
    assert rank1["run_dir"] == rank0["run_dir"] == str(tmp_path / "runs" / rank0["name"])
    assert "already holds a run" in rank0["taken"] and "already holds a run" in rank1["taken"]
