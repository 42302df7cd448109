"""Writing the files we own (CDI specs, the checkpoint, health.json, our directories) safely.

Whoever can write to the CDI or state directory must not be able to redirect our writes: temp
files are created with O_EXCL | O_NOFOLLOW under unpredictable names, relative to a descriptor
of the directory, then swapped with the target (or renamed to its name where there is none); the
old file is unlinked. Neither follows a planted symlink: it is swapped out or replaced. Modes are
set explicitly, so the process umask never decides who can read a checkpoint or write a spec.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path

#: The longest unix socket path bind() takes on Linux (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH_BYTES = 107

#: renameat2(2)'s flag that swaps two names atomically (Linux 3.15; glibc 2.28 has the call).
_RENAME_EXCHANGE = 2
#: Errnos of a kernel or filesystem without the exchange: a plain rename does instead.
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


def _libc_renameat2() -> Callable[..., int] | None:
    """libc's renameat2, or None (an older libc, or an interpreter that cannot load libraries)."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except OSError:
        return None


_renameat2 = _libc_renameat2()

#: Directories we create: the kubelet, the runtime and `dradriver status` read them, nobody else writes.
DIRECTORY_MODE = 0o755
_TEMP_SUFFIX = ".tmp"


class StorageError(Exception):
    """A write to a directory we own failed (a full, read-only or failing disk); str() is one
    line naming the directory and the errno. Whoever raises it has changed nothing."""


def error_text(err: OSError) -> str:
    """`ENOSPC (No space left on device)`: the errno by name, what an operator searches for."""
    name = errno.errorcode.get(err.errno or 0, f"errno {err.errno}")
    return f"{name} ({err.strerror or err})"


def storage_error(action: str, directory: Path, err: OSError) -> StorageError:
    """`cannot <action> in <directory>: ENOSPC (No space left on device)`."""
    return StorageError(f"cannot {action} in {directory}: {error_text(err)}")


def check_writable(directory: Path, target_name: str, size: int) -> None:
    """Write and remove a temp file of `size` bytes beside `target_name` (recovery's leftover
    cleanup removes it after a crash): OSError where a write of that size would fail now."""
    dir_fd = _open_directory(directory)
    try:
        tmp = _write_temp(dir_fd, target_name, b"\0" * size, 0o600, durable=False)
        os.unlink(tmp, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


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


def _write_temp(dir_fd: int, name: str, data: bytes, mode: int, durable: bool) -> str:
    """A new temp file beside `name` holding `data` (fsynced if `durable`); returns its name."""
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
        if durable:
            os.fsync(fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)
    return tmp


def _replace(dir_fd: int, name: str, data: bytes, mode: int, durable: bool) -> None:
    tmp = _write_temp(dir_fd, name, data, mode, durable)
    try:
        swapped = _exchange(dir_fd, tmp, name)
        if not swapped:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    if swapped:  # the old content, now under the temp name (start-up removes it after a crash)
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # a rename refuses to replace a directory: so does this
            _exchange(dir_fd, tmp, name)
            os.unlink(tmp, dir_fd=dir_fd)
            raise


def _exchange(dir_fd: int, tmp: str, name: str) -> bool:
    """Swap `tmp` and an existing `name` atomically; False where `name` does not exist or the
    filesystem cannot swap. Why not a rename over it: ext4 starts writing back the new file's
    data first (auto_da_alloc): 0.16 ms a write against 0.07 ms (bench/bench_file_replace.py)."""
    if _renameat2 is None:
        return False
    if _renameat2(dir_fd, os.fsencode(tmp), dir_fd, os.fsencode(name), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOENT or err in _NO_EXCHANGE:
        return False
    raise OSError(err, os.strerror(err), name)


def write_atomically(target: Path, data: bytes, *, mode: int, durable: bool = True) -> None:
    """Replace `target` with `data` so that readers see the old or the new content, never a mix,
    also when the process is killed at any instant (temp file, then swap or rename). With `durable` the
    content and the rename are fsynced, so that a power failure leaves one whole version; without,
    a power failure may leave the old version or, on some filesystems, an empty file."""
    dir_fd = _open_directory(target.parent)
    try:
        _replace(dir_fd, target.name, data, mode, durable)
        if durable:
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_files_atomically(directory: Path, files: Mapping[str, bytes], *, mode: int) -> dict[str, OSError]:
    """`write_atomically` without `durable` for many files of one directory, one after the other
    (with nothing to wait for, threads would only add their own cost). Returns the error of each
    file that could not be written."""
    if not files:
        return {}
    dir_fd = _open_directory(directory)
    errors: dict[str, OSError] = {}
    try:
        for name, data in files.items():
            try:
                _replace(dir_fd, name, data, mode, durable=False)
            except OSError as err:
                errors[name] = err
    finally:
        os.close(dir_fd)
    return errors
