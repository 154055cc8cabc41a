"""Reading files that a rank writes, from a process that may be root (the agent)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


def open_directory_below(trusted: Path, path: Path, *, make: bool = False) -> int:
    """A descriptor of directory `path`, reached from `trusted` (which it lies in) one
    component at a time without following a symlink: ValueError when `path` is not below
    `trusted`, OSError (ELOOP, ENOTDIR) when a component is a symlink or no directory.
    `make`: the missing components are made (mode 0777 less the umask).

    A rank owns the directories below its job's (its working and checkpoint directories): it
    may replace one by a symlink to any directory, which root, writing there by its path,
    would follow. Whatever is written through the descriptor lands in the directory reached,
    however the path is changed afterwards."""
    parts = path.relative_to(trusted).parts
    if make:
        trusted.mkdir(parents=True, exist_ok=True)
    fd = os.open(trusted, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file; OSError for anything else.

    A rank owns the directories its files are in: a symlink it leaves there (to any file root
    may read) is never followed, and a FIFO (whose read never ends) or a directory is
    refused, not read."""
    return _regular(os.open(path, _READ), path)


def open_regular_in(directory: Path, name: str) -> BinaryIO:
    """`open_regular` of `name` in `directory`, the directory not reached through a symlink
    either (a rank may replace its checkpoint directory by one between two looks)."""
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(name, _READ, dir_fd=directory_fd)
    finally:
        os.close(directory_fd)
    return _regular(fd, directory / name)


# No symlink followed; a FIFO opened without blocking, to be refused.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def _regular(fd: int, shown: Path) -> BinaryIO:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(shown))
    return os.fdopen(fd, "rb")


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of `path`, read as `open_regular` opens it (no symlink followed,
    a FIFO or anything but a regular file refused, never blocking): for the small files a
    rank's user can replace (pid files), which a read by path would follow or block on."""
    with open_regular(path) as handle:
        return handle.read(limit)
