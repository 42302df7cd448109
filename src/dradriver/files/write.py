"""Writing the files we own (CDI specs, the checkpoint, health.json, our directories) safely.

Whoever can write to the CDI or state directory must not be able to redirect our writes: temp
files are created with O_EXCL | O_NOFOLLOW under unpredictable names, relative to a descriptor
of the directory, and renamed over the target (a rename replaces a planted symlink rather than
following it). Modes are set explicitly, so the process umask never decides who can read a
checkpoint or write a spec.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: The longest unix socket path bind() takes on Linux (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH_BYTES = 107

#: Directories we create: the kubelet, the runtime and `dradriver status` read them, nobody else writes.
DIRECTORY_MODE = 0o755
_TEMP_SUFFIX = ".tmp"


def ensure_directory(path: Path, mode: int = DIRECTORY_MODE) -> None:
    """Create `path` and missing parents with `mode` exactly; existing directories are left alone."""
    missing = []
    current = path
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not directory.is_dir():
                raise NotADirectoryError(20, "Not a directory", str(directory)) from None
            continue
        os.chmod(directory, mode, follow_symlinks=False)


def temp_name(name: str) -> str:
    """`.<name>.<random>.tmp`: hidden and not *.json, so CDI runtimes skip it."""
    return f".{name}.{secrets.token_hex(6)}{_TEMP_SUFFIX}"


def is_temp_name(name: str, target_prefix: str) -> bool:
    """Whether `name` is a temp file of a target whose name starts with `target_prefix`."""
    return name.startswith(f".{target_prefix}") and name.endswith(_TEMP_SUFFIX)


def _open_directory(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


#: Files of one batch are written (and fsynced) this many at a time: the filesystem commits
#: concurrent fsyncs together, so a batch costs far less than its files one by one.
BATCH_WORKERS = 8


def _write_temp(dir_fd: int, name: str, data: bytes, mode: int) -> str:
    """A new temp file beside `name` holding `data`, fsynced; returns its name."""
    while True:
        tmp = temp_name(name)
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
            )
            break
        except FileExistsError:
            continue
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)
    return tmp


def _replace(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    tmp = _write_temp(dir_fd, name, data, mode)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_atomically(target: Path, data: bytes, *, mode: int, sync_directory: bool = True) -> None:
    """Replace `target` with `data` so that readers see the old or the new content, never a mix,
    even after a power failure (the data is fsynced before the rename). The rename itself is
    durable only with `sync_directory` (an fsync of the directory)."""
    dir_fd = _open_directory(target.parent)
    try:
        _replace(dir_fd, target.name, data, mode)
        if sync_directory:
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_files_atomically(
    directory: Path, files: Mapping[str, bytes], *, mode: int, sync_directory: bool = True
) -> dict[str, OSError]:
    """`write_atomically` for many files of one directory, in parallel, with (`sync_directory`)
    one fsync of the directory at the end. Returns the error of each file that could not be written."""
    if not files:
        return {}
    dir_fd = _open_directory(directory)
    errors: dict[str, OSError] = {}

    def write(name: str) -> None:
        try:
            _replace(dir_fd, name, files[name], mode)
        except OSError as err:
            errors[name] = err

    try:
        if len(files) == 1:  # a thread for one file costs ten times its write on a tmpfs
            write(next(iter(files)))
        else:
            with ThreadPoolExecutor(
                max_workers=min(BATCH_WORKERS, len(files)), thread_name_prefix="write"
            ) as pool:
                list(pool.map(write, files))
        if sync_directory:
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return errors
