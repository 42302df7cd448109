"""When to scan the node again, and handing a changed device set on.

One thread waits for a kick (NVML's MIG config event, a changed fake profile file, an unprepare
that may free a vanished device) or for the rescan interval, scans, and calls `apply` when the
published device set changes. A scan that fails (NVML down for a driver upgrade, a profile file
half-written) keeps what is published and is retried at the next kick or interval.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from pathlib import Path

from dradriver import logs
from dradriver.devicemodel import DeviceSet
from dradriver.inventory.effective import LiveDevices, effective_devices

#: How often a profile file is looked at (a stat: nothing is read unless it changed).
FILE_POLL_SECONDS = 0.25

log = logs.get_logger(component="inventory")


@dataclass(kw_only=True, eq=False)
class InventoryWatcher:
    scan: Callable[[], DeviceSet]
    held: Callable[[], Set[str]]
    apply: Callable[[LiveDevices], None]
    #: What is published now: replaced by each scan that changes it.
    published: LiveDevices
    interval: float
    _kicked: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def kick(self) -> None:
        """Scan now (from any thread)."""
        self._kicked.set()

    def released(self) -> None:
        """A claim was unprepared: scan now if a vanished device was kept for one (it may go)."""
        if self.published.gone:
            self._kicked.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inventory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join(10)

    def check(self) -> bool:
        """Scan once and apply a change; True if the published set changed."""
        scanned = self.scan()
        result = effective_devices(scanned, self.published, self.held())
        if result == self.published:
            return False
        before = {d.name: d for d in self.published.devices.devices}
        after = {d.name: d for d in result.devices.devices}
        log.info(
            "inventory changed",
            added=sorted(after.keys() - before.keys()),
            removed=sorted(before.keys() - after.keys()),
            changed=sorted(n for n in after.keys() & before.keys() if after[n] != before[n]),
            gone_but_prepared=sorted(result.gone),
        )
        self.published = result
        self.apply(result)
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._kicked.wait(self.interval if self.interval > 0 else None)
            self._kicked.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception as err:  # keep what is published; the next kick or interval retries
                log.warning(
                    "rescanning the node's devices failed; keeping the published devices", error=str(err)
                )


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
