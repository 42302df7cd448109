"""Kicking the live inventory when a fake GPU profile file changes (NVML nodes have MIG events)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dradriver import logs

#: How often a profile file is looked at (a stat: nothing is read unless it changed).
FILE_POLL_SECONDS = 0.25

log = logs.get_logger(component="inventory")


class ProfileFileTrigger:
    """Kicks when a fake GPU profile file is replaced or rewritten (also through a ConfigMap's
    symlink swap: the file is stat'ed through its links)."""

    def __init__(self, path: Path, kick: Callable[[], None], poll: float = FILE_POLL_SECONDS) -> None:
        self._path = path
        self._kick = kick
        self._poll = poll
        self._stop = threading.Event()
        self._seen = self._identity()
        self._thread = threading.Thread(target=self._run, name="profile-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            current = self._identity()
            if current != self._seen:
                self._seen = current
                log.info("fake GPU profile file changed", path=str(self._path), at=time.time())
                self._kick()
