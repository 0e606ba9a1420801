"""The run directory: its name, its lock, and the checks that keep one run from clobbering another.

    <output_dir>/<run.name>/
        .lock            the PID of the run using the directory, flock-ed for the run's whole life
        .oxrl-run        the marker that says an oxRL run claimed the directory (JSON: format, created)
        config.yaml      the resolved config          metrics.jsonl     one row per logged step
        checkpoints/     step folders                 final/            the final HF folder
        summary.json, samples.json, curves.png, report.md
        train.log        rank 0's log          failure.txt, bug_report.md   what stopped it; `oxrl report`

Rank 0 claims the directory before anything is written (`claim_run_dir`):

- a second run on a directory in use fails at once, naming the holder's PID. The lock is an
  `fcntl.flock`, so the OS releases it when the holder dies, however it dies; the `.lock` file
  itself stays (deleting a lock file races with a process that has just opened it);
- a directory that already holds a run is refused unless `run.resume` continues it or
  `run.overwrite` clears it first (only what a run writes, see RUN_OUTPUTS; other files stay;
  symlinks are unlinked, never followed). Overwrite clears only a directory that an oxRL run
  claimed, as its `.oxrl-run` marker says: another tool's `checkpoints/` or `wandb/` is refused,
  and so is `run.resume=true` there when it holds no checkpoint (the run would start afresh over
  those files). A run directory from before the marker existed resumes as before; to overwrite
  it, delete its files yourself. Overwrite first moves the old outputs aside (renames, which
  cannot half-succeed: a failure puts back what was moved and deletes nothing), then deletes them;
- the `.lock` and the marker are regular files: a symlink there is never written through;
- a resume lists every config key that differs from the run's saved `config.yaml` and stops unless
  `run.accept_config_changes` is set; then the new values apply from the resumed step (oxrl/training/resume_check.py);
- a resume from an earlier checkpoint of the same run drops the later checkpoints, which belong to
  the abandoned continuation (MetricsLogger drops their metrics rows the same way), but only once the run has
  loaded the checkpoint and checked it against its model and data (oxrl/training/checkpoint.py
  `drop_abandoned_checkpoints`, called by the loops): a refusal at any point before leaves every checkpoint as it was.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

from oxrl.config.schema import Config
from oxrl.files import not_regular
from oxrl.training.folders import OutputWriteError, RunDirError, remove_path

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
# Written by the run that claims a directory: what tells an oxRL run from a folder of another tool's files with
# the same generic names (`checkpoints/`, `wandb/`). Only a folder holding it is ever cleared by `run.overwrite`.
MARKER_NAME = ".oxrl-run"
MARKER_FORMAT = 1  # the value of its `oxrl_run` key
# Where overwrite moves the old outputs before deleting them; oxRL's own name (a leftover is deleted next time).
OVERWRITTEN = ".oxrl-overwritten"
# Any of these means the directory holds a run (oxRL's, or one that looks like it).
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints", "final")
# Everything a run writes into its directory: what `run.overwrite` clears.
RUN_OUTPUTS = RUN_MARKERS + (".final.partial", "summary.json", "samples.json", "curves.png", "report.md", "tensorboard",
                             "wandb", "train.log", "failure.txt", "bug_report.md")


def default_run_name(algorithm: str, output_dir: str) -> str:
    """`<algorithm>-<YYYYmmdd-HHMMSS>-<4 hex digits>`, not yet taken in `output_dir`: unnamed runs never
    share a directory (two started in the same second by a race would meet at the lock, not clobber)."""
    while True:
        name = f"{algorithm}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        if not run_dir_for(output_dir, name).exists():
            return name


def run_dir_for(output_dir: str, name: str) -> Path:
    """`<output_dir>/<name>`; `OXRL_CHECKPOINT_DIR` replaces the default output_dir `runs`."""
    parent = os.environ.get("OXRL_CHECKPOINT_DIR") if output_dir == "runs" else None
    return Path(parent or output_dir) / name


def resume_checkpoint(resume: bool | str, run_dir: Path) -> Path | None:
    """The checkpoint `run.resume` names: the latest in `run_dir` for `true`, else the given path."""
    if resume is False:
        return None
    if resume is True:
        from oxrl.training.checkpoint import latest_checkpoint  # (the checkpoint modules: loaded by a resume only)

        return latest_checkpoint(run_dir)  # None: nothing saved yet, the run starts from scratch
    return Path(resume)


def resume_path(cfg: Config, run_dir: Path) -> Path | None:
    """The checkpoint this run continues from (`run.resume`), or None to start from scratch."""
    found = resume_checkpoint(cfg.run.resume, run_dir)
    if cfg.run.resume is True and found is None:
        logger.warning("run.resume is true but %s holds no checkpoint: starting from scratch", run_dir)
    return found


class RunLock:
    """An exclusive `flock` on `<run_dir>/.lock`, which holds the owner's PID."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        fd = _open_lock(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunDirError(f"run directory {self.path.parent} is in use by process {holder} (lock {self.path}): "
                              "wait for it to finish, or choose another run.name") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def claim_run_dir(run_dir: Path, cfg: Config, check_rank_state: Callable[[Path, int], None] | None = None) -> RunLock:
    """Create and lock `run_dir`, then check that `cfg` may use it (module docstring), a resumed checkpoint's
    rank_state files by `check_rank_state` (oxrl/training/checkpoint.py `check_intact`). Writes nothing but the lock
    file and the marker, unless `run.overwrite` clears an old run."""
    run_dir = Path(run_dir)
    _make_dir(run_dir)
    lock = RunLock(run_dir).acquire()
    overwrite = cfg.run.overwrite  # what becomes of a folder holding a run: cleared, or a refusal
    try:
        resume_from = resume_checkpoint(cfg.run.resume, run_dir)
        inside = resume_from is not None and resume_from.parent.resolve() == (run_dir / "checkpoints").resolve()
        if inside and overwrite:
            raise RunDirError(f"run.overwrite would clear {run_dir}, which holds the checkpoint run.resume names: set only one")
        if resume_from is not None:
            from oxrl.training.resume_check import check_resumable  # (a resume's own checks: off a new run's path)

            check_resumable(resume_from, cfg, check_rank_state)
        elif cfg.run.resume is True and holds_run(run_dir) and not is_oxrl_run(run_dir):
            raise RunDirError(f"run.resume: {run_dir} holds no checkpoint to continue, and starting afresh would write "
                              f"over {_foreign(run_dir)}")
        if holds_run(run_dir) and not (cfg.run.resume is True or inside):
            if not overwrite:
                raise RunDirError(_refusal(run_dir, cfg.run.resume))
            if not is_oxrl_run(run_dir):
                raise RunDirError(f"run.overwrite: {run_dir} was not cleared: overwrite deletes only an oxRL run's "
                                  f"outputs, and it holds {_foreign(run_dir)}")
            clear_run(run_dir)
        _unlink_linked_outputs(run_dir)
        _write_marker(run_dir)
    except BaseException:
        lock.release()
        raise
    return lock


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run's files (an oxRL run, or files of the same names: see `is_oxrl_run`)."""
    return any(os.path.lexists(Path(run_dir) / name) for name in RUN_MARKERS)


def is_oxrl_run(run_dir: Path) -> bool:
    """Whether an oxRL run claimed `run_dir`: its marker is a regular file there (a symlink is not one) holding
    what `_write_marker` writes."""
    try:
        fd = os.open(Path(run_dir) / MARKER_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # absent, a symlink (ELOOP), unreadable: not a marker
        return False
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        text = file.read(4096)
    try:
        content = json.loads(text)
    except ValueError:
        return False
    return isinstance(content, dict) and content.get("oxrl_run") == MARKER_FORMAT


def clear_run(run_dir: Path) -> None:
    """Remove what a run writes (RUN_OUTPUTS); other files in the directory stay. A symlink among them is
    unlinked, never followed: what it points to is not the run's.

    The outputs are first renamed into OVERWRITTEN (a rename moves a symlink, not what it points to), so that a
    failure cannot leave half an old run: every rename succeeds, or those done are undone and nothing is deleted."""
    run_dir = Path(run_dir)
    trash = run_dir / OVERWRITTEN
    remove_path(trash)  # what an earlier overwrite could not delete
    trash.mkdir()
    moved: list[str] = []
    for name in RUN_OUTPUTS:
        if not os.path.lexists(run_dir / name):
            continue
        try:
            os.rename(run_dir / name, trash / name)
        except OSError as error:
            for done in reversed(moved):
                os.rename(trash / done, run_dir / done)
            trash.rmdir()
            raise RunDirError(f"run.overwrite: could not move {run_dir / name} aside ({error.strerror or error}), so "
                              "nothing was deleted: fix its permissions, or choose another run.name") from error
        moved.append(name)
    try:
        remove_path(trash)
    except OSError as error:  # the old run is gone from the directory already: the new one may start
        logger.warning("run.overwrite: could not delete all of the previous run's outputs, moved to %s (%s): "
                       "delete it yourself", trash, error)
    logger.warning("run.overwrite: cleared the previous run's outputs from %s (%s)", run_dir, ", ".join(moved))


def _unlink_linked_outputs(run_dir: Path) -> None:
    """Unlink a symlink where the run will write one of its files (train.log, metrics.jsonl, ...): written
    through, a link would have the run append to whatever it points to. Folders (a `checkpoints/` moved to
    another disk) are left: what the run writes there are new files of its own."""
    for name in RUN_OUTPUTS:
        path = Path(run_dir) / name
        if path.is_symlink() and not path.is_dir():
            path.unlink()
            logger.warning("%s was a symlink; removed it (the link only) rather than write through it", path)


def _write_marker(run_dir: Path) -> None:
    """Claim `run_dir` for oxRL (once): written beside and renamed into place, which replaces a symlink there
    rather than writing through it."""
    if is_oxrl_run(run_dir):
        return
    partial = Path(run_dir) / f"{MARKER_NAME}.partial"
    remove_path(partial)
    content = json.dumps({"oxrl_run": MARKER_FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as file:
        file.write(content + "\n")
    try:
        os.rename(partial, Path(run_dir) / MARKER_NAME)
    except OSError as error:  # a folder of that name
        partial.unlink()
        raise RunDirError(f"{Path(run_dir) / MARKER_NAME} is in the way of oxRL's run marker ({error.strerror}): "
                          "remove it, or choose another run.name") from error


def _open_lock(path: Path) -> int:
    """The lock file opened for reading and writing (created if absent): a regular file, never a symlink's target
    (a `.lock` linked to another file would have that file truncated to our PID)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.EISDIR):
            raise
        what = "a symlink" if error.errno == errno.ELOOP else "a folder"
        raise RunDirError(f"{path} is {what}, not a run's lock file: remove it (oxRL never writes through it), "
                          "or choose another run.name") from error
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise RunDirError(f"{path} {not_regular(path, mode)}, so it cannot be a run's lock file: remove it, or "
                          "choose another run.name")
    return fd


def _make_dir(run_dir: Path) -> None:
    """mkdir -p, with the one-line error of a path that is (under) a regular file."""
    for path in (run_dir, *run_dir.parents):
        if path.exists() and not path.is_dir():
            raise OutputWriteError(errno.ENOTDIR, "not a directory (a file is in the way of the run directory)", str(path))
    run_dir.mkdir(parents=True, exist_ok=True)


def _refusal(run_dir: Path, resume: bool | str) -> str:
    about = f" (run.resume names {resume}, a checkpoint of another run)" if isinstance(resume, str) else ""
    return (f"run directory {run_dir} already holds a run{about}: set run.resume=true to continue it, "
            "run.overwrite=true to replace it, or choose another run.name")


def _foreign(run_dir: Path) -> str:
    """What `run_dir` holds that no oxRL run claimed, and what to do: the end of a refusal."""
    found = ", ".join(name for name in RUN_MARKERS if os.path.lexists(Path(run_dir) / name))
    return (f"{found} but no {MARKER_NAME} marker, so no oxRL run wrote them (or one from before the marker did): "
            "choose another run.name or run.output_dir, or delete those files yourself")
