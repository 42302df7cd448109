"""The fake backend's event log: what `fake-event` appends and what `serve` makes of it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from dradriver.backend.fake.health import (
    FAKE_EVENTS_FILE,
    FakeEventRecord,
    FakeHealthSource,
    append_fake_event,
)
from dradriver.health.events import GpuLostEvent, HardwareRef, RecoveryEvent, XidEvent
from dradriver.health.recovery import RecoveryAction

PLACES = {"gpu-0": HardwareRef("GPU-0"), "gpu-1": HardwareRef("GPU-1"), "mig": HardwareRef("GPU-1", 3, 0)}


def source(state_dir: Path) -> FakeHealthSource:
    return FakeHealthSource(state_dir, PLACES.get, poll_seconds=0.01)


def xid(device: str, code: int, at: float = 100.0) -> FakeEventRecord:
    return FakeEventRecord(device=device, xid=code, at=at)


def lost(device: str, is_lost: bool = True, at: float = 100.0) -> FakeEventRecord:
    return FakeEventRecord(device=device, lost=is_lost, at=at)


def test_appended_events_are_read_in_order(tmp_path: Path) -> None:
    fake = source(tmp_path)
    assert fake.next_events(0.05) == []
    append_fake_event(tmp_path, xid("gpu-0", 79))
    append_fake_event(tmp_path, xid("mig", 31, at=101))
    assert fake.next_events(1) == [
        XidEvent(HardwareRef("GPU-0"), 79, 100.0),
        XidEvent(HardwareRef("GPU-1", 3, 0), 31, 101.0),
    ]
    assert fake.next_events(0.02) == []


def test_lost_gpu_fails_its_recheck_until_restored(tmp_path: Path) -> None:
    fake = source(tmp_path)
    append_fake_event(tmp_path, lost("mig"))  # a MIG device's GPU is lost as a whole
    assert fake.next_events(1) == [
        GpuLostEvent(HardwareRef("GPU-1"), "marked lost with dradriver fake-event", 100.0)
    ]
    assert (
        fake.check("GPU-1") == "GPU marked lost; dradriver fake-event --device mig --restore brings it back"
    )
    assert fake.check("GPU-0") is None
    append_fake_event(tmp_path, lost("gpu-1", False))
    assert fake.next_events(1) == []  # found again is no event: the re-check notices
    assert fake.check("GPU-1") is None


def test_restart_replays_lost_gpus_but_not_old_xids(tmp_path: Path) -> None:
    append_fake_event(tmp_path, xid("gpu-0", 79))
    append_fake_event(tmp_path, lost("gpu-0"))
    append_fake_event(tmp_path, lost("gpu-1"))
    append_fake_event(tmp_path, lost("gpu-1", at=200))
    append_fake_event(tmp_path, lost("gpu-0", False))
    fake = source(tmp_path)
    assert fake.next_events(1) == [
        GpuLostEvent(HardwareRef("GPU-1"), "marked lost with dradriver fake-event", 200.0)
    ]
    assert fake.check("GPU-1") is not None
    assert fake.check("GPU-0") is None


def test_bad_lines_unknown_devices_and_partial_lines_are_skipped(tmp_path: Path) -> None:
    fake = source(tmp_path)
    log = tmp_path / FAKE_EVENTS_FILE
    with log.open("a") as f:
        f.write("not json\n")
        f.write('{"device": "gpu-0", "xid": 79, "lost": true, "at": 1}\n')  # both kinds
        f.write('{"device": "gpu-9", "xid": 79, "at": 1}\n')  # no such device
        f.write('{"device": "gpu-0", "xid": 48, "at": 1}\n{"device": "gpu-0", "xi')
    assert fake.next_events(1) == [XidEvent(HardwareRef("GPU-0"), 48, 1.0)]
    with log.open("a") as f:
        f.write('d": 74, "at": 2}\n')
    assert fake.next_events(1) == [XidEvent(HardwareRef("GPU-0"), 74, 2.0)]


def test_truncated_log_starts_over(tmp_path: Path) -> None:
    fake = source(tmp_path)
    append_fake_event(tmp_path, xid("gpu-0", 79))
    append_fake_event(tmp_path, xid("gpu-0", 79))
    assert len(fake.next_events(1)) == 2
    (tmp_path / FAKE_EVENTS_FILE).write_text("")
    append_fake_event(tmp_path, xid("gpu-1", 48))
    assert fake.next_events(1) == [XidEvent(HardwareRef("GPU-1"), 48, 100.0)]


def test_idle_wait_polls_at_the_poll_interval_until_the_timeout(tmp_path: Path) -> None:
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        time.sleep(seconds)

    fake = FakeHealthSource(tmp_path, PLACES.get, sleep=nap)
    assert fake.next_events(0.5) == []
    assert 1 <= len(naps) <= 3
    assert all(0 < n <= 0.2 for n in naps)


def test_recovery_actions_travel_with_xids_and_hold_the_recheck(tmp_path: Path) -> None:
    fake = source(tmp_path)
    append_fake_event(tmp_path, xid("gpu-0", 79))  # never set: as a host driver without the field
    append_fake_event(tmp_path, FakeEventRecord(device="mig", xid=13, recovery="gpu-reset", at=101))
    append_fake_event(tmp_path, xid("gpu-1", 31, at=102))  # later XIDs on that GPU carry its action
    assert fake.next_events(1) == [
        XidEvent(HardwareRef("GPU-0"), 79, 100.0, None),
        XidEvent(HardwareRef("GPU-1", 3, 0), 13, 101.0, RecoveryAction.GPU_RESET),
        XidEvent(HardwareRef("GPU-1"), 31, 102.0, RecoveryAction.GPU_RESET),
    ]
    assert fake.check("GPU-1") == (
        "GPU reset needed (NVML recovery action); "
        "dradriver fake-event --device mig --recovery-action none clears it"
    )
    assert fake.check("GPU-0") is None
    again = source(tmp_path)  # a restarted serve: the action is state (reported), the XIDs history
    (found,) = again.next_events(0.02)
    assert isinstance(found, RecoveryEvent)
    assert (found.where, found.action) == (HardwareRef("GPU-1"), RecoveryAction.GPU_RESET)
    assert again.check("GPU-1") is not None
    append_fake_event(tmp_path, FakeEventRecord(device="gpu-1", recovery="none", at=103))
    assert fake.next_events(0.05) == []  # an action alone is no event (read at once): the re-check notices
    assert fake.check("GPU-1") is None


def test_a_record_is_one_kind_of_event() -> None:
    with pytest.raises(ValidationError, match="lost goes with neither xid nor recovery"):
        FakeEventRecord(device="gpu-0", lost=True, recovery="none", at=1)
    with pytest.raises(ValidationError, match="one of xid, recovery and lost must be set"):
        FakeEventRecord(device="gpu-0", at=1)
    with pytest.raises(ValidationError, match="recovery"):
        FakeEventRecord.model_validate({"device": "gpu-0", "recovery": "reboot-please", "at": 1})
