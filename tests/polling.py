"""Waiting for a condition that another thread or process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """True as soon as `predicate()` is truthy; False if it still is not after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
