"""The health board: the latest health of every published device, shared by its consumers.

Producers (health sources, the device set) write to it; the kubelet's NodeWatchResources
streams, device taints and metrics read from it. Readers block on `wait_for_change` instead of
polling, so an idle node costs nothing.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace


class Health(enum.IntEnum):
    """Numerically equal to the HealthStatus wire enum (the same in v1 and v1alpha1)."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealth:
    pool_name: str
    device_name: str
    health: Health
    #: Unix seconds of the last change (or confirmation) of this device's health.
    last_updated: int
    message: str = ""


class HealthBoard:
    """Thread-safe map of (pool, device) -> DeviceHealth with change notification."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: dict[tuple[str, str], DeviceHealth] = {}
        self._version = 0
        self._closed = False
        self._known = threading.Event()

    def set_devices(self, devices: Iterable[tuple[str, str]]) -> None:
        """Replace the device list; devices already known keep their health, new ones are HEALTHY."""
        now = int(time.time())
        with self._cond:
            self._devices = {
                key: self._devices.get(key) or DeviceHealth(key[0], key[1], Health.HEALTHY, now)
                for key in devices
            }
            self._bump()
        self._known.set()

    def wait_until_known(self, timeout: float) -> bool:
        """Block until the device list has been set once (discovery runs after the sockets are up)."""
        return self._known.wait(timeout)

    def update(self, pool_name: str, device_name: str, health: Health, message: str = "") -> bool:
        """Record a device's health; returns False for a device that is not published."""
        key = (pool_name, device_name)
        with self._cond:
            current = self._devices.get(key)
            if current is None:
                return False
            if current.health != health or current.message != message:
                self._devices[key] = replace(
                    current, health=health, message=message, last_updated=int(time.time())
                )
                self._bump()
            return True

    def snapshot(self) -> tuple[int, list[DeviceHealth]]:
        """The current version and every device's health, in a stable order."""
        with self._cond:
            return self._version, [self._devices[k] for k in sorted(self._devices)]

    def wait_for_change(self, version: int, timeout: float) -> bool:
        """Block until the board moves past `version`, it is closed, `wake` is called or `timeout` passes.

        Returns True if the version changed.
        """
        with self._cond:
            if self._version == version and not self._closed:
                self._cond.wait(timeout)
            return self._version != version

    def wake(self) -> None:
        """Wake every waiter (e.g. because its stream was cancelled)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Release all waiters for good; used at shutdown so streams end promptly."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._known.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()
