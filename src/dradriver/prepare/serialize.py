"""The lock that serializes prepare and unprepare across the driver's instances on a node.

During a surge rollout two pods of the driver run side by side and the kubelet may call either
(the newest connected one, by preference). Like the Go helper with `RollingUpdate`, every call
takes an exclusive `flock` on `<plugin dir>/serialize.lock` for its checkpoint and CDI work, so
two instances never write the checkpoint at once. The kernel drops it when its holder dies.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType


class SerializeLock:
    """`with lock:` holds the node-wide lock. One holder in this process at a time: the driver
    takes it under its own call lock (`GpuDriver._exclusive`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None
