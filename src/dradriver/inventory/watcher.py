"""When to scan the node again, and handing a changed device set on.

One thread waits for a kick (NVML's MIG config event, a changed fake profile file, an unprepare
that may free a vanished device) or for the rescan interval, scans, and calls `apply` when the
published device set changes. A scan that fails (NVML down for a driver upgrade, a profile file
half-written) keeps what is published and is retried at the next kick or interval.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Set
from dataclasses import dataclass, field

from dradriver import logs
from dradriver.devicemodel import DeviceSet
from dradriver.inventory.effective import LiveDevices, effective_devices

log = logs.get_logger(component="inventory")


@dataclass(kw_only=True, eq=False)
class InventoryWatcher:
    scan: Callable[[], DeviceSet]
    held: Callable[[], Set[str]]
    apply: Callable[[LiveDevices], None]
    #: What is published now: replaced by each scan that changes it.
    published: LiveDevices
    interval: float
    #: Set to scan now, by `kick` or by whoever was handed it before the watcher was made.
    kicked: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def kick(self) -> None:
        """Scan now (from any thread)."""
        self.kicked.set()

    def released(self) -> None:
        """A claim was unprepared: scan now if a vanished device was kept for one (it may go)."""
        if self.published.gone:
            self.kicked.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="inventory", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.kicked.set()
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
            self.kicked.wait(self.interval if self.interval > 0 else None)
            self.kicked.clear()
            if self._stop.is_set():
                return
            try:
                self.check()
            except Exception as err:  # keep what is published; the next kick or interval retries
                log.warning(
                    "rescanning the node's devices failed; keeping the published devices", error=str(err)
                )
