"""Output folders written whole or not at all, and write errors that name the path.

A checkpoint or the final model is written into a partial folder and renamed into place when
complete (`publish_folder`). If anything fails on the way, `writing_folder` removes the partial
folder and re-raises; an I/O failure becomes an `OutputWriteError`, an `OSError` that names the
folder. torch and safetensors report a full disk as "basic_ios::clear: iostream error",
"[enforce fail at inline_container.cc] unexpected pos", "PytorchStreamWriter failed writing file"
or "I/O error: ... (os error 28)", none of which says which folder was being written.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

from oxrl.errors import UserError

logger = logging.getLogger(__name__)

# Fragments of torch's stream-writer failures (an I/O error whose cause the message does not carry).
_TORCH_WRITE_FAILURES = ("iostream error", "inline_container.cc", "PytorchStreamWriter", "file write failed")
_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")
# Free space under which a failed write is blamed on a full disk.
_NEARLY_FULL_BYTES = 1 << 20


class RunDirError(UserError):
    """The run directory cannot be used as asked (in use, holds another run, config changed on resume)."""


class OutputWriteError(OSError):
    """A file or folder could not be written (disk full, read-only, a file in the way); names the path."""

    def __str__(self) -> str:
        return f"could not write {self.filename}: {self.strerror}"


@contextmanager
def writing_folder(partial: Path, target: Path, remove_on_error: bool = True):
    """Run the block that writes `partial` (which becomes `target`). On any failure the partial folder
    is removed (by the process that owns it: `remove_on_error`) and the error re-raised, I/O errors
    as an OutputWriteError naming `target`."""
    try:
        yield partial
    except BaseException as error:  # an interrupt must not leave a partial folder either
        wrapped = as_write_error(error, Path(target)) if isinstance(error, Exception) else None
        if remove_on_error:
            _remove_partial(Path(partial))
        if wrapped is None:
            raise
        raise wrapped from error


def publish_folder(partial: Path, target: Path) -> Path:
    """Rename a complete partial folder into place, replacing an older `target`."""
    remove_path(target)
    partial.rename(target)
    return target


def remove_path(path: Path) -> None:
    """Delete `path` if it exists: a folder with everything in it, anything else (a symlink to a folder
    included) unlinked. Symlinks are never followed, at any depth: what they point to is not ours to delete
    (`shutil.rmtree` unlinks those inside a folder, but refuses a symlink given as the folder itself)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def as_write_error(error: Exception, target: Path) -> OutputWriteError | None:
    """`error` as an OutputWriteError naming `target` when it is an I/O failure, else None.
    Call it before the partial folder is removed: a full disk is recognised by its free space."""
    if isinstance(error, OutputWriteError):
        return error
    if isinstance(error, OSError) and error.errno is not None:
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(target) else ""
        return OutputWriteError(error.errno, f"{error.strerror or error}{where}", str(target))
    message = str(error)
    code = _OS_ERROR_CODE.search(message)  # safetensors: "I/O error: No space left on device (os error 28)"
    if code is not None:
        number = int(code.group(1))
        return OutputWriteError(number, os.strerror(number), str(target))
    if any(fragment in message for fragment in _TORCH_WRITE_FAILURES):
        number = _likely_cause(target)
        detail = os.strerror(number) if number != errno.EIO else f"write failed ({message.strip()})"
        return OutputWriteError(number, detail, str(target))
    return None


def _likely_cause(target: Path) -> int:
    """ENOSPC on a (nearly) full file system, EROFS on a read-only one, else EIO."""
    existing = next((p for p in (target, *target.parents) if p.exists()), None)
    if existing is None:
        return errno.EIO
    stats = os.statvfs(existing)
    if stats.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if stats.f_bavail * stats.f_frsize < _NEARLY_FULL_BYTES:
        return errno.ENOSPC
    return errno.EIO


def _remove_partial(partial: Path) -> None:
    try:
        remove_path(partial)
    except OSError as cleanup_error:  # the original error matters more; say what is left behind
        logger.warning("could not remove the partial folder %s: %s", partial, cleanup_error)
