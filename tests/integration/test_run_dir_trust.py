"""Run directories and checkpoints oxRL did not write, or not as they are now: overwrite deletes only an oxRL
run's own outputs and never through a symlink; `run.name` is one folder name; a checkpoint's recorded step is its
folder's, and a damaged or hostile checkpoint file is one line naming it, refused before a resume deletes anything.

Claims go through `claim_run_dir` (no model); resumes through `oxrl train` on a copy of one tiny finished run.
"""

import errno
import json
import os
import random
import re
import shutil
import threading
from pathlib import Path

import pytest
import torch

from oxrl.cli import main
from oxrl.config.load import ConfigError, load_config
from oxrl.config.schema import Config
from oxrl.training.run_dir import RunDirError, claim_run_dir, run_dir_for
from tests.conftest import make_tiny_llama
from tests.integration.test_run_dir import _snapshot, errors  # noqa: F401 (a fixture)
from tests.integration.test_runner import _write_config

BASE = {"model": {"name_or_path": "m"}, "algorithm": {"name": "sft"}}


def _claim(output_dir: Path, **run) -> None:
    cfg = Config.model_validate({"run": {"name": "x", "output_dir": str(output_dir), **run}, **BASE})
    claim_run_dir(run_dir_for(cfg.run.output_dir, cfg.run.name), cfg).release()


def _another_tools_folder(folder: Path) -> None:
    """Outputs of another tool, under the generic names an oxRL run also uses."""
    (folder / "checkpoints" / "epoch-3").mkdir(parents=True)
    (folder / "checkpoints" / "epoch-3" / "model.pt").write_bytes(b"their weights")
    (folder / "wandb" / "run-1").mkdir(parents=True)
    (folder / "config.yaml").write_text("their: config\n")


# --- what overwrite may delete ----------------------------------------------------------------------------------

@pytest.mark.parametrize("linked", [False, True], ids=["folder", "run-dir-is-a-symlink-to-it"])
def test_overwrite_refuses_a_folder_that_no_oxrl_run_claimed(tmp_path, linked):
    other = tmp_path / ("elsewhere" if linked else "runs") / "x"
    _another_tools_folder(other)
    if linked:
        (tmp_path / "runs").mkdir()
        (tmp_path / "runs" / "x").symlink_to(other, target_is_directory=True)
    before = _snapshot(other)
    with pytest.raises(RunDirError, match=r"run.overwrite: .*x was not cleared: overwrite deletes only an oxRL run's "
                                          r"outputs, and it holds config.yaml, checkpoints but no \.oxrl-run marker"):
        _claim(tmp_path / "runs", overwrite=True)
    assert {k: v for k, v in _snapshot(other).items() if k != ".lock"} == before  # (the lock is taken first)
    assert (other / "wandb" / "run-1").is_dir() and not (other / ".oxrl-run").exists()


def test_resume_true_there_without_a_checkpoint_is_refused_too(tmp_path):
    other = tmp_path / "runs" / "x"
    _another_tools_folder(other)
    (other / "metrics.jsonl").write_text('{"their": 1}\n')
    before = _snapshot(other)
    with pytest.raises(RunDirError, match="holds no checkpoint to continue, and starting afresh would write over "
                                          r"config.yaml, metrics.jsonl, checkpoints but no \.oxrl-run marker"):
        _claim(tmp_path / "runs", resume=True)
    assert {k: v for k, v in _snapshot(other).items() if k != ".lock"} == before


@pytest.mark.parametrize("marker", ["symlink", "", "{}", '{"oxrl_run": 1'])
def test_a_marker_oxrl_did_not_write_does_not_make_a_folder_an_oxrl_run(tmp_path, marker):
    run = tmp_path / "runs" / "x"
    _another_tools_folder(run)
    if marker == "symlink":  # to a real marker elsewhere: the folder would name another's claim as its own
        (tmp_path / "real").write_text('{"oxrl_run": 1}\n')
        (run / ".oxrl-run").symlink_to(tmp_path / "real")
    else:
        (run / ".oxrl-run").write_text(marker)
    with pytest.raises(RunDirError, match=r"no \.oxrl-run marker"):
        _claim(tmp_path / "runs", overwrite=True)
    assert (run / "checkpoints" / "epoch-3" / "model.pt").read_bytes() == b"their weights"


def test_overwrite_clears_only_a_runs_outputs_and_unlinks_symlinks_without_following_them(tmp_path):
    _claim(tmp_path)  # an oxRL run claims x/ and marks it
    run = tmp_path / "x"
    assert json.loads((run / ".oxrl-run").read_text())["oxrl_run"] == 1
    (run / "config.yaml").write_text("run: {}\n")
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "notes.txt").write_text("mine")  # not a run output: stays
    elsewhere = tmp_path / "precious"
    (elsewhere / "step_000001").mkdir(parents=True)
    (elsewhere / "step_000001" / "weights").write_bytes(b"keep")
    (run / "checkpoints").symlink_to(elsewhere, target_is_directory=True)  # rmtree refused this, half-way through
    (run / "final").mkdir()
    (run / "final" / "link").symlink_to(elsewhere, target_is_directory=True)  # a link inside a cleared folder
    (run / "summary.json").symlink_to(elsewhere / "step_000001" / "weights")
    _claim(tmp_path, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [".lock", ".oxrl-run", "notes.txt"]
    assert (elsewhere / "step_000001" / "weights").read_bytes() == b"keep"


def test_an_overwrite_that_cannot_move_an_output_aside_deletes_nothing(tmp_path, monkeypatch):
    _claim(tmp_path)
    run = tmp_path / "x"
    for name in ("config.yaml", "metrics.jsonl", "checkpoints/step_000001/model.safetensors", "final/config.json"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(name)
    before = _snapshot(run)
    rename = os.rename

    def failing(source, target):  # e.g. a folder the user cannot write (root cannot be refused by permissions)
        if Path(source).name == "checkpoints":
            raise PermissionError(errno.EACCES, "Permission denied")
        rename(source, target)

    monkeypatch.setattr(os, "rename", failing)
    with pytest.raises(RunDirError, match=r"could not move .*checkpoints aside \(Permission denied\), so nothing was "
                                          "deleted"):
        _claim(tmp_path, overwrite=True)
    assert _snapshot(run) == before and not (run / ".oxrl-overwritten").exists()


def test_a_lock_file_that_is_a_symlink_is_never_written_through(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / ".lock").symlink_to(precious)  # opened as it was, it would be truncated to our PID
    with pytest.raises(RunDirError, match=r"\.lock is a symlink, not a run's lock file: remove it"):
        _claim(tmp_path)
    assert precious.read_text() == "keep me"


@pytest.mark.parametrize("name", ["../x", "/tmp/elsewhere", ".", "..", "a/b", "a\\b", "a\0b", "x" * 256])
def test_run_name_is_one_folder_name(name):
    with pytest.raises(ConfigError, match=r"run.name must be one folder name .*got '"):
        load_config(None, base={"run": {"name": name}, **BASE})


# --- checkpoints a resume must not trust ------------------------------------------------------------------------

class Hostile:
    """Unpickling this runs code: a checkpoint file holding it must be refused, never executed."""

    def __init__(self, witness: Path):
        self.witness = str(witness)

    def __reduce__(self):
        return (exec, (f"open({self.witness!r}, 'w').write('ran')",))


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, smollm2_tokenizer):
    """A finished run with checkpoints at steps 1 and 2 (copied by each test that damages it)."""
    base = tmp_path_factory.mktemp("ckpt")
    model = make_tiny_llama(vocab_size=len(smollm2_tokenizer))
    model.config.eos_token_id = smollm2_tokenizer.eos_token_id
    model.save_pretrained(base / "tiny-model")
    smollm2_tokenizer.save_pretrained(base / "tiny-model")
    config = _write_config(base, base / "tiny-model", train={"max_steps": 2}, checkpoint={"every": 1, "keep_last": 3})
    assert main(["train", str(config)]) == 0
    return base


def _copy_run(source: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(its config, its checkpoints/ folder) of a copy of the run in `source`."""
    shutil.copytree(source, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "cfg.yaml"
    config.write_text(config.read_text().replace(str(source), str(tmp_path)))
    return config, tmp_path / "runs" / "tiny" / "checkpoints"


def _resume(config: Path, resume: str | Path = "true") -> int:
    return main(["train", str(config), "train.max_steps=4", f"run.resume={resume}", "run.accept_config_changes=true"])


@pytest.mark.parametrize("fields, says", [
    ({"step": -5}, r"step -5 is not a count, an integer >= 0"),
    ({"step": 3}, r"records step 3 but its folder is step_000002 \(step 2\)"),
    ({"step": "2"}, r'step "2" is not a count'),
    ({"step": True}, r"step true is not a count"),
    ({"step": None}, r"step null is not a count"),
    ({"tokens_seen": -1}, r"tokens_seen -1 is not a count"),
    ({"nonfinite_steps": "x" * 500}, r'nonfinite_steps "x{39}\.\.\. is not a count'),
])
def test_a_recorded_step_or_count_that_is_not_a_count_or_not_the_folders_is_refused_and_nothing_is_deleted(
        two_checkpoints, tmp_path, errors, fields, says):
    config, checkpoints = _copy_run(two_checkpoints, tmp_path)
    state = checkpoints / "step_000002" / "training_state" / "trainer_state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), **fields}))
    before = _snapshot(checkpoints)
    assert _resume(config) == 2
    assert len(errors) == 1 and str(state) in errors[0] and len(errors[0].splitlines()) == 1, errors
    assert re.search(says, errors[0]), errors
    assert _snapshot(checkpoints) == before  # step -5 dropped the step-1 checkpoint as an "abandoned continuation"


def _random_bytes(path: Path) -> bytes:
    return random.Random(0).randbytes(path.stat().st_size)


def _hostile(path: Path) -> bytes:
    torch.save({"state": Hostile(path.with_name("PWNED"))}, path)
    return path.read_bytes()


DAMAGE = {  # what becomes of a file, given its path
    "empty": lambda path: b"",
    "truncated": lambda path: path.read_bytes()[: path.stat().st_size // 2],
    "random bytes": _random_bytes,
    "hostile pickle": _hostile,
    "a JSON list": lambda path: b"[1, 2, 3]",
    "JSON of another shape": lambda path: b'{"python": 5, "numpy": []}',
    "a torch file of another shape": lambda path: (torch.save({"last_epoch": -1, "base_lrs": [1e-3]}, path),
                                                   path.read_bytes())[1],
}


@pytest.mark.parametrize("file, damage", [
    ("optimizer.pt", "empty"), ("optimizer.pt", "truncated"), ("optimizer.pt", "random bytes"),
    ("optimizer.pt", "hostile pickle"), ("scheduler.pt", "random bytes"), ("scheduler.pt", "hostile pickle"),
    ("scheduler.pt", "a torch file of another shape"), ("rng.pt", "hostile pickle"), ("rng.pt", "truncated"),
    ("rng.json", "a JSON list"), ("rng.json", "JSON of another shape"), ("rng.json", "empty"),
    ("trainer_state.json", "truncated"), ("trainer_state.json", "a JSON list"),
    ("../model.safetensors", "truncated"), ("../model.safetensors", "random bytes"),
])
def test_a_damaged_checkpoint_file_is_one_line_naming_it_before_a_rewind_deletes_anything(
        two_checkpoints, tmp_path, errors, file, damage):
    config, checkpoints = _copy_run(two_checkpoints, tmp_path)
    target = (checkpoints / "step_000001" / "training_state" / file).resolve()
    target.write_bytes(DAMAGE[damage](target))
    before = _snapshot(checkpoints)
    assert _resume(config, checkpoints / "step_000001") == 2  # a rewind: step_000002 would go
    assert len(errors) == 1 and len(errors[0].splitlines()) == 1, errors
    assert errors[0].startswith(f"{target}: ") and "run.resume=<its path>" in errors[0], errors
    assert "weights_only" not in errors[0]  # never the advice to load a hostile file as a pickle
    assert not list(tmp_path.rglob("PWNED"))
    assert _snapshot(checkpoints) == before


@pytest.mark.parametrize("file", ["training_state/optimizer.pt", "model.safetensors"])
def test_a_checkpoint_file_that_does_not_fit_the_run_is_one_line_naming_it(two_checkpoints, tmp_path, errors, file):
    from safetensors.torch import save_file

    config, checkpoints = _copy_run(two_checkpoints, tmp_path)
    target = checkpoints / "step_000002" / file
    if target.suffix == ".pt":  # another model's, each a sound file of its kind
        torch.save(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))]).state_dict(), target)
        says = f"{target}: does not fit this run's optimizer ("
    else:
        save_file({"model.embed_tokens.weight": torch.zeros(2, 2)}, target)
        says = f"{target.parent}: its weights do not fit this model ("
    assert _resume(config) == 2
    assert len(errors) == 1 and errors[0].startswith(says) and len(errors[0].splitlines()) == 1, errors


def test_a_fifo_in_a_checkpoint_is_refused_by_what_it_is_not_waited_on(two_checkpoints, tmp_path, errors):
    config, checkpoints = _copy_run(two_checkpoints, tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rng = checkpoints / "step_000002" / "training_state" / "rng.pt"
    rng.unlink()
    rng.symlink_to(fifo)
    # Should a reader open the FIFO (the bug), this writer lets it go on, to fail rather than hang the test.
    writer = threading.Thread(target=lambda: os.close(os.open(fifo, os.O_WRONLY)), daemon=True)
    writer.start()
    try:
        assert _resume(config) == 2
        assert errors[-1].startswith(f"{rng}: is a FIFO (named pipe) (a symlink to {fifo}), not a regular file"), errors
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # frees the writer when nothing opened the FIFO
        writer.join(5)


def test_a_step_folder_that_is_a_symlink_is_unlinked_by_a_rewind_not_followed(two_checkpoints, tmp_path):
    config, checkpoints = _copy_run(two_checkpoints, tmp_path)
    kept = tmp_path / "kept-elsewhere"
    (checkpoints / "step_000002").rename(kept)
    (checkpoints / "step_000002").symlink_to(kept, target_is_directory=True)
    before = _snapshot(kept)
    assert _resume(config, checkpoints / "step_000001") == 0  # rmtree refused the link, with a traceback
    assert _snapshot(kept) == before
    assert not (checkpoints / "step_000002").is_symlink() and (checkpoints / "step_000004").is_dir()


def test_a_run_from_before_the_marker_resumes_and_is_marked(two_checkpoints, tmp_path):
    config, checkpoints = _copy_run(two_checkpoints, tmp_path)
    (checkpoints.parent / ".oxrl-run").unlink()
    assert _resume(config) == 0
    assert json.loads((checkpoints.parent / ".oxrl-run").read_text())["oxrl_run"] == 1


@pytest.mark.parametrize("damage", ["empty", "truncated", "random bytes", "hostile pickle"])
def test_every_rank_loads_torch_state_files_as_one_line_errors_without_running_them(tmp_path, damage):
    """What the other ranks (which do not check the checkpoint first) meet when they load a damaged file."""
    from oxrl.training.checkpoint_files import CheckpointError, load_torch_state

    path = tmp_path / "training_state" / "optimizer.pt"
    path.parent.mkdir()
    torch.save({"state": {}, "param_groups": [{"lr": 0.1}]}, path)
    path.write_bytes(DAMAGE[damage](path))
    with pytest.raises(CheckpointError) as raised:
        load_torch_state(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: damaged checkpoint file (") and len(message.splitlines()) == 1, message
    assert "weights_only" not in message and not list(tmp_path.rglob("PWNED"))


def test_the_files_a_run_writes_are_never_written_through_a_symlink(tmp_path):
    _claim(tmp_path)
    run = tmp_path / "x"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in ("train.log", "failure.txt", "metrics.jsonl", "summary.json"):
        (run / name).symlink_to(victim)
    _claim(tmp_path, overwrite=True)
    assert [name for name in ("train.log", "failure.txt", "metrics.jsonl", "summary.json")
            if os.path.lexists(run / name)] == []
    assert victim.read_text() == "precious\n"
    (run / "train.log").symlink_to(victim)  # a marked run resumed with no checkpoint yet
    _claim(tmp_path, resume=True)
    assert not (run / "train.log").is_symlink() and victim.read_text() == "precious\n"
