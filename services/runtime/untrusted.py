"""Reading files that a rank writes, from a process that may be root (the agent)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file; OSError for anything else.

    A rank owns the directories its files are in: a symlink it leaves there (to any file root
    may read) is never followed, and a FIFO (whose read never ends) or a directory is
    refused, not read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")
