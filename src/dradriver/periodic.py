"""A daemon thread that does one thing every so often until it is stopped."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True, eq=False)
class Periodic:
    """Calls `step` every `interval` seconds on a daemon thread named `name`, from `start` until
    `stop`: first at once with `at_start`, else after one interval."""

    step: Callable[[], object]
    interval: float
    name: str
    #: A step that raises is logged with this message and the next one comes at its time: a
    #: passing fault must not end the loop.
    failed: str
    log: Any
    at_start: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        if self.at_start:
            self._step_once()
        while not self._stop.wait(self.interval):
            self._step_once()

    def _step_once(self) -> None:
        try:
            self.step()
        except Exception:
            self.log.exception(self.failed)
