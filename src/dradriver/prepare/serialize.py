"""The lock that serializes prepare and unprepare across the driver's instances on a node.

During a surge rollout two pods of the driver run side by side and the kubelet may call either
(the newest connected one, by preference). Like the Go helper with `RollingUpdate`, every call
takes an exclusive `flock` on `<plugin dir>/serialize.lock` for its checkpoint and CDI work, so
two instances never write the checkpoint at once. A flock belongs to an open file description,
so the threads of one instance exclude each other as well; the kernel drops it when its holder dies.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from types import TracebackType


class SerializeLock:
    """`with lock:` holds the node-wide lock; re-entrant within one thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()

    def __enter__(self) -> None:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._local.fd = fd
        self._local.depth = depth + 1

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            os.close(self._local.fd)  # closing the only descriptor releases the flock
            del self._local.fd
