"""Real tmpfs mounts for the fault suite: a directory that fills up or turns read-only under
a running driver. Mounting needs root (CAP_SYS_ADMIN); without it the test skips with one line."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)


@contextmanager
def tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """A fresh tmpfs of `size` mounted at `path` (created), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("tmpfs fault tests need root to mount a tmpfs")
    mounted = _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        _run("umount", "-l", str(path))


def remount(path: Path, mode: str) -> None:
    """`ro` or `rw`: the mount at `path` turns read-only or writable again."""
    result = _run("mount", "-o", f"remount,{mode}", str(path))
    assert result.returncode == 0, result.stderr


def fill(path: Path) -> Path:
    """Fill the filesystem of `path` to the last byte with one file; remove it to free the space."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
        assert os.statvfs(path).f_bavail == 0
    finally:
        os.close(fd)
    return filler
