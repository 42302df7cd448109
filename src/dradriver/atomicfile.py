"""Files that readers see whole or not at all: the checkpoint, CDI specs, state files."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(target: Path, data: bytes, *, mode: int) -> None:
    """Replace `target` with `data` so that readers see the old or the new content, never a mix.

    The temp file is `.<name>.tmp`: hidden, and not ending in .json/.yaml, so CDI runtimes skip it.
    """
    tmp = target.with_name(f".{target.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(fd, mode)  # the umask must not make a spec unreadable or a checkpoint world-readable
        out.write(data)
        out.flush()
        os.fsync(fd)
    os.replace(tmp, target)
    fsync_directory(target.parent)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
