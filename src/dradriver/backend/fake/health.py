"""Health events on a fake-GPU node: an append-only log in the state directory.

`dradriver fake-event` appends one JSON line per command to `<state-dir>/fake-events.jsonl`;
the running `serve --fake-gpus` follows the file (a stat every 0.2 s while idle) and turns each
line into the event NVML would report for that device:

    {"device": "gpu-3", "xid": 79, "at": 1717243200.0}     an XID on the device
    {"device": "gpu-3", "xid": 79, "recovery": "gpu-reset", "at": ...}
                                                           ... and NVML's recovery action with it
    {"device": "gpu-3", "recovery": "none", "at": ...}     its GPU's recovery action from now on
    {"device": "gpu-3", "lost": true, "at": ...}           its GPU falls off the bus
    {"device": "gpu-3", "lost": false, "at": ...}          its GPU answers again

A GPU whose recovery action was never set reports no action at all, as a host driver without the field
(the fixed XID table decides); once set, its later XIDs carry it and its re-check fails while
an action is needed. XIDs written while no `serve` ran are history and are skipped at start;
whether a GPU is lost, and its recovery action, are state, replayed from the whole file, so a
restarted `serve` still sees them (a GPU still needing an action is reported at start).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dradriver import logs
from dradriver.health import recovery
from dradriver.health.events import GpuLostEvent, HardwareRef, HealthEvent, RecoveryEvent, XidEvent
from dradriver.health.recovery import RecoveryAction
from dradriver.health.xid import MAX_XID

FAKE_EVENTS_FILE = "fake-events.jsonl"
#: How often an idle `serve` looks at the log: 5 stats a second cost nothing measurable.
POLL_SECONDS = 0.2
#: At most this much of the log is read per look (a line is far shorter).
MAX_READ_BYTES = 1024 * 1024

log = logs.get_logger(component="health")


#: How the log and `fake-event --recovery-action` spell NVML's recovery actions.
RECOVERY_NAMES: dict[str, RecoveryAction] = {a.flag_name: a for a in RecoveryAction}


class FakeEventRecord(BaseModel):
    """One line of the log: an XID on a device (with its GPU's recovery action, if given), its
    GPU's recovery action alone, or its GPU lost / found again."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Annotated[str, Field(min_length=1, max_length=63)]
    xid: Annotated[int, Field(ge=0, le=MAX_XID)] | None = None
    recovery: Literal[tuple(RECOVERY_NAMES)] | None = None  # type: ignore[valid-type]
    lost: bool | None = None
    at: Annotated[float, Field(allow_inf_nan=False)]

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if self.lost is not None and (self.xid is not None or self.recovery is not None):
            raise ValueError("lost goes with neither xid nor recovery")
        if self.lost is None and self.xid is None and self.recovery is None:
            raise ValueError("one of xid, recovery and lost must be set")
        return self


def append_fake_event(state_dir: Path, record: FakeEventRecord) -> Path:
    """Append `record` to the log; one O_APPEND write, so concurrent writers never interleave."""
    path = state_dir / FAKE_EVENTS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        if os.fstat(fd).st_size == 0:
            os.fchmod(fd, 0o644)  # whatever the umask: the daemon reads it
        os.write(fd, (record.model_dump_json(exclude_none=True) + "\n").encode())
    finally:
        os.close(fd)
    return path


class FakeHealthSource:
    """Follows the fake-event log; `locate` names the hardware under a device (see targets)."""

    name = "fake"

    def __init__(
        self,
        state_dir: Path,
        locate: Callable[[str], HardwareRef | None],
        *,
        poll_seconds: float = POLL_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._path = state_dir / FAKE_EVENTS_FILE
        self._locate = locate
        self._poll = poll_seconds
        self._sleep = sleep
        self._offset = 0
        self._lost: dict[str, str] = {}  # GPU UUID -> the device named when it was marked lost
        # GPU UUID -> its recovery action and the device named when it was set.
        self._recovery: dict[str, tuple[RecoveryAction, str]] = {}
        # The last loss of each GPU still lost; the XIDs in the history are not replayed.
        history = {e.where.gpu_uuid: e for e in self._read_new() if isinstance(e, GpuLostEvent)}
        self._pending: list[HealthEvent] = [e for uuid, e in history.items() if uuid in self._lost]
        self._pending += [
            RecoveryEvent(HardwareRef(uuid), action, time.time())
            for uuid, (action, _device) in self._recovery.items()
            if recovery.needs_action(action)
        ]

    def unmonitored(self) -> Mapping[str, str]:
        return {}

    def next_events(self, timeout: float) -> list[HealthEvent]:
        if self._pending:
            events, self._pending = self._pending, []
            return events
        deadline = time.monotonic() + timeout
        while True:
            events = self._read_new()
            left = deadline - time.monotonic()
            if events or left <= 0:
                return events
            self._sleep(min(self._poll, left))

    def check(self, gpu_uuid: str) -> str | None:
        device = self._lost.get(gpu_uuid)
        if device is not None:
            return f"GPU marked lost; dradriver fake-event --device {device} --restore brings it back"
        action, device = self._recovery.get(gpu_uuid, (RecoveryAction.NONE, ""))
        if recovery.needs_action(action):
            clear = f"dradriver fake-event --device {device} --recovery-action none clears it"
            return f"{recovery.describe(action)}; {clear}"
        return None

    def watch(self, gpu_uuids: Sequence[str]) -> None:
        """Nothing to register: `locate` follows the published devices."""

    def driver_problem(self) -> str | None:
        """Fake GPUs have no host driver to lose."""
        return None

    def close(self) -> None:
        """Nothing held open between polls."""

    def _read_new(self) -> list[HealthEvent]:
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return []  # not there yet (or not a file we would follow)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return []
            if st.st_size < self._offset:  # truncated or replaced: start over
                self._offset = 0
            if st.st_size == self._offset:
                return []
            f.seek(self._offset)
            data = f.read(min(st.st_size - self._offset, MAX_READ_BYTES))
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == MAX_READ_BYTES:
            log.warning("skipping an overlong line in the fake-event log", path=str(self._path))
            end = len(data)
        complete = data[:end]  # a line still being written waits
        self._offset += len(complete)
        events = []
        for line in complete.splitlines():
            event = self._event(line)
            if event is not None:
                events.append(event)
        return events

    def _event(self, line: bytes) -> HealthEvent | None:
        try:
            record = FakeEventRecord.model_validate_json(line)
        except ValidationError as err:
            log.warning("ignoring a bad line in the fake-event log", path=str(self._path), error=str(err))
            return None
        where = self._locate(record.device)
        if where is None:
            log.warning(
                "fake event for a device with no hardware under it (unknown, or a MIG placement not created)",
                device=record.device,
            )
            return None
        if record.recovery is not None:
            self._recovery[where.gpu_uuid] = (RECOVERY_NAMES[record.recovery], record.device)
        if record.xid is not None:
            action = self._recovery.get(where.gpu_uuid)
            return XidEvent(where, record.xid, record.at, None if action is None else action[0])
        if record.lost is None:  # a recovery action alone: state, no event (as NVML)
            return None
        gpu = HardwareRef(where.gpu_uuid)
        if not record.lost:
            self._lost.pop(gpu.gpu_uuid, None)
            return None
        self._lost[gpu.gpu_uuid] = record.device
        return GpuLostEvent(gpu, "marked lost with dradriver fake-event", record.at)
