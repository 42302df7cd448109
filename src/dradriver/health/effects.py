"""What a health change does: the board (-> the kubelet's stream and metrics), device taints
on the published slices, `<state-dir>/health.json` for `dradriver status`, and Node Events.

Each is a `HealthSink`; the daemon picks the ones that apply (no taints or Events without a
cluster).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dradriver import logs
from dradriver.files.write import ensure_directory, write_atomically
from dradriver.health import HEALTH_FILE
from dradriver.health.board import Health, HealthBoard
from dradriver.health.policy import Problem, Transition, timestamp
from dradriver.health.taints import describe_taint, device_taint

Json = dict[str, Any]

log = logs.get_logger(component="health")


class BoardSink:
    """The board feeds the NodeWatchResources streams and the devices-by-health gauge."""

    def __init__(self, board: HealthBoard, pool_name: str) -> None:
        self._board = board
        self._pool = pool_name

    def apply(self, changes: Sequence[Transition], problems: Mapping[str, Problem]) -> None:
        for change in changes:
            self._board.update(self._pool, change.device, change.health, change.message)


class Taints:
    """The taints the published slices should carry, as the last health change left them."""

    def __init__(self, driver_name: str, effect: str) -> None:
        self._driver = driver_name
        self._effect = effect
        self._lock = threading.Lock()
        self._taints: dict[str, Json] = {}

    def taints(self) -> dict[str, Json]:
        """Device name -> its taint, for the slice renderer (called from the publisher's thread)."""
        with self._lock:
            return dict(self._taints)

    def set(self, problems: Mapping[str, Problem]) -> bool:
        """Taint the devices with these problems (and no other); whether that changed anything."""
        wanted = {
            device: device_taint(self._driver, problem, self._effect) for device, problem in problems.items()
        }
        with self._lock:
            if wanted == self._taints:
                return False
            self._taints = wanted
            return True


class TaintSink:
    """Sets the taints; `on_change` republishes them."""

    def __init__(self, taints: Taints, on_change: Callable[[], None]) -> None:
        self._taints = taints
        self._on_change = on_change

    def apply(self, changes: Sequence[Transition], problems: Mapping[str, Problem]) -> None:
        if self._taints.set(problems):
            self._on_change()


class HealthFileSink:
    """`<state-dir>/health.json`, replaced atomically on every change, read by `dradriver status`."""

    def __init__(self, state_dir: Path, board: HealthBoard, source_name: str) -> None:
        self.path = state_dir / HEALTH_FILE
        self._board = board
        self._source = source_name

    def apply(self, changes: Sequence[Transition], problems: Mapping[str, Problem]) -> None:
        _, devices = self._board.snapshot()
        document = {
            "source": self._source,
            "devices": [
                {
                    "device": d.device_name,
                    "pool": d.pool_name,
                    "health": d.health.name,
                    "lastUpdated": timestamp(d.last_updated),
                    "message": d.message,
                    **({"reason": problems[d.device_name].reason} if d.device_name in problems else {}),
                }
                for d in devices
            ],
        }
        try:
            ensure_directory(self.path.parent)
            write_atomically(self.path, json.dumps(document, indent=1).encode() + b"\n", mode=0o644)
        except OSError as err:
            log.warning("could not write the health file", path=str(self.path), error=str(err))


class EventSender(Protocol):
    def send(self, reason: str, message: str, event_type: Any) -> None: ...


#: Event reason and type for each new health.
_EVENT_KINDS = {
    Health.UNHEALTHY: ("DeviceUnhealthy", "Warning"),
    Health.HEALTHY: ("DeviceHealthy", "Normal"),
    Health.UNKNOWN: ("DeviceHealthUnknown", "Warning"),
}


class NodeEventSink:
    """One Node Event per health change; devices that change together with the same message
    (a GPU and its MIG devices) share one Event."""

    def __init__(self, sender: EventSender, driver_name: str, effect: str) -> None:
        self._sender = sender
        self._driver = driver_name
        self._effect = effect

    def apply(self, changes: Sequence[Transition], problems: Mapping[str, Problem]) -> None:
        groups: dict[tuple[Health, str], list[str]] = {}
        for change in changes:
            if change.changed:
                groups.setdefault((change.health, change.message), []).append(change.device)
        for (health, message), devices in groups.items():
            reason, event_type = _EVENT_KINDS[health]
            text = f"{_device_list(devices)}: {message}"
            problem = problems.get(devices[0])
            if health is Health.UNHEALTHY and problem is not None:
                text += f"; tainted {describe_taint(device_taint(self._driver, problem, self._effect))}"
            self._sender.send(reason, text, event_type)


def _device_list(devices: Sequence[str], shown: int = 8) -> str:
    if len(devices) == 1:
        return devices[0]
    more = f", ... ({len(devices)} devices)" if len(devices) > shown else f" ({len(devices)} devices)"
    return ", ".join(devices[:shown]) + more
