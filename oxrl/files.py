"""Input files are regular files, read within a bound.

A FIFO blocks `open` until something writes to it (a run would wait forever, silently, holding its run lock)
and a character device such as /dev/zero or /dev/urandom never ends (reading one fills the memory). Neither is
data: a data or image path that names one, directly or through a symlink, is refused by what it is, before
anything opens it. `read_bounded` checks the file it has opened (without blocking), so a file swapped for a
FIFO after the check is refused too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class InputFileError(ValueError):
    """A path that cannot be read as an input file; the message is the problem, without the path."""


def kind_of(mode: int) -> str:
    """What a file of `st_mode` `mode` is, in words: "a regular file", "a FIFO (named pipe)", ..."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else "not a file")


def not_regular(path: Path, mode: int) -> str:
    """The problem with `path`, of mode `mode`, which is not a regular file (naming a symlink's target)."""
    target = f" (a symlink to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return f"is {kind_of(mode)}{target}, not a regular file"


def check_regular(path: Path) -> int:
    """The size of `path`, a regular file (symlinks followed); an InputFileError saying what it is otherwise.
    OSError (not found, no permission) as `os.stat` raises it."""
    status = os.stat(path)
    if not stat.S_ISREG(status.st_mode):
        raise InputFileError(not_regular(path, status.st_mode))
    return status.st_size


def first_irregular(folder: Path, recursive: bool = True) -> tuple[Path, str] | None:
    """The first entry under `folder` (at any depth, or in it only unless `recursive`; symlinks followed) that is
    neither a folder nor a regular file, and the problem with it; None when there is none. A symlink loop is walked
    once."""
    seen: set[tuple[int, int]] = set()
    pending = [folder]
    while pending:
        current = pending.pop()
        status = os.stat(current)
        if (status.st_dev, status.st_ino) in seen:
            continue
        seen.add((status.st_dev, status.st_ino))
        for entry in sorted(current.iterdir()):
            try:
                mode = os.stat(entry).st_mode
            except FileNotFoundError:
                return entry, "is a symlink to nothing"
            if stat.S_ISDIR(mode):
                if recursive:
                    pending.append(entry)
            elif not stat.S_ISREG(mode):
                return entry, not_regular(entry, mode)
    return None


def read_bounded(path: Path, limit: int, what: str = "an input file") -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (`what` names the bound in the error); an
    InputFileError otherwise.

    Opened without blocking (a FIFO would wait for a writer) and checked as opened; the read stops past `limit`
    whatever the file claimed (one that grows while being read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise InputFileError(not_regular(path, status.st_mode))
        if status.st_size > limit:
            raise InputFileError(f"{status.st_size:,} bytes, more than the {limit:,} {what} may have")
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputFileError(f"grew past {limit:,} bytes while being read")
    return bytes(data)
