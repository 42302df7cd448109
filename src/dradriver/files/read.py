"""Reading input files without hanging or exhausting memory, whatever the path points at.

FIFOs are opened non-blocking and refused, as are directories, devices and sockets: only regular
files are read, and never more than a limit. `/dev/zero` under a spec's name, a FIFO among the
claim files or a 10 GB file all end as one `FileReadError` line.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileReadError(OSError):
    """The file cannot be read as input; str() is one line naming the file."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


def size_text(limit: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit >= size and limit % size == 0:
            return f"{limit // size} {unit}"
    return f"{limit} bytes"


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_bytes(path: Path | str, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The content of a regular file of at most `limit` bytes; FileReadError otherwise
    (FileNotFoundError's errno is kept, so callers can tell a missing file apart)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_symlinks:
            raise FileReadError(path, "is a symbolic link; refusing to follow it") from None
        error = FileReadError(path, f"cannot read: {err.strerror or err}")
        error.errno = err.errno
        raise error from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileReadError(path, f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise FileReadError(path, f"is larger than {size_text(limit)} (the limit)")
        chunks = []
        left = limit + 1  # one byte more tells a file that grew since fstat
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise FileReadError(path, f"is larger than {size_text(limit)} (the limit)")
        return b"".join(chunks)
    except OSError as err:
        if isinstance(err, FileReadError):
            raise
        raise FileReadError(path, f"cannot read: {err.strerror or err}") from None
    finally:
        os.close(fd)


def decode_text(data: bytes, path: Path | str) -> str:
    """UTF-8 text (a leading byte-order mark is dropped); FileReadError naming the bad byte."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        raise FileReadError(
            path, f"is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})"
        ) from None


def read_text(path: Path | str, limit: int, *, follow_symlinks: bool = True) -> str:
    return decode_text(read_bytes(path, limit, follow_symlinks=follow_symlinks), path)
