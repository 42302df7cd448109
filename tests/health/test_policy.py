"""The health policy, pure: XID classes, what an event means, and the unhealthy -> healthy cycle."""

from __future__ import annotations

import pytest

from dradriver.health.board import Health
from dradriver.health.config import HealthConfig
from dradriver.health.events import GpuLostEvent, HardwareRef, RecoveryEvent, ThresholdEvent, XidEvent
from dradriver.health.policy import Assessment, HealthTracker, Problem, Transition, assess, timestamp
from dradriver.health.recovery import RecoveryAction
from dradriver.health.xid import XidClass, classify, describe

GPU = HardwareRef("GPU-1")
AT = 1_717_243_200.0  # 2024-06-01T12:00:00Z


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_nvidias_application_xids_are_ignored_by_default(xid: int) -> None:
    assert classify(xid) is XidClass.APPLICATION


@pytest.mark.parametrize(("xid", "expected"), [(63, "informational"), (92, "informational"), (48, "fatal")])
def test_default_classes(xid: int, expected: str) -> None:
    assert classify(xid) == expected


def test_unlisted_xids_are_fatal_unless_configured_otherwise() -> None:
    assert classify(79) is XidClass.FATAL
    assert classify(4242) is XidClass.FATAL
    assert classify(4242, unlisted=XidClass.INFORMATIONAL) is XidClass.INFORMATIONAL
    assert classify(79, unlisted=XidClass.INFORMATIONAL) is XidClass.INFORMATIONAL  # 79 is not a default


def test_overrides_win_over_defaults() -> None:
    overrides = {13: XidClass.FATAL, 94: XidClass.APPLICATION}
    assert classify(13, overrides) is XidClass.FATAL
    assert classify(94, overrides) is XidClass.APPLICATION
    assert classify(31, overrides) is XidClass.APPLICATION


def test_descriptions() -> None:
    assert describe(79) == "XID 79 (GPU has fallen off the bus)"
    assert describe(4242) == "XID 4242"


def test_fatal_xid_becomes_a_problem_with_a_human_message() -> None:
    assessment = assess(XidEvent(GPU, 79, AT), HealthConfig())
    assert assessment.event_class is XidClass.FATAL
    assert assessment.problem == Problem("79", "XID 79 (GPU has fallen off the bus) at 2024-06-01T12:00:00Z")


def test_application_xid_is_no_problem_but_an_override_makes_it_one() -> None:
    assert assess(XidEvent(GPU, 13, AT), HealthConfig()).problem is None
    config = HealthConfig.model_validate({"xids": {13: "fatal"}})
    problem = assess(XidEvent(GPU, 13, AT), config).problem
    assert problem is not None
    assert problem.reason == "13"


def test_lost_gpus_and_thresholds_are_fatal() -> None:
    lost = assess(GpuLostEvent(GPU, "NVML GPU is lost", AT), HealthConfig())
    assert lost.problem == Problem("gpu-lost", "GPU lost (NVML GPU is lost) at 2024-06-01T12:00:00Z")
    hot = assess(ThresholdEvent(GPU, "temperature", "temperature 95 °C", AT), HealthConfig())
    assert hot.problem == Problem("temperature", "temperature 95 °C at 2024-06-01T12:00:00Z")


XID79 = Problem("79", "XID 79 at T0")
LOST = Problem("gpu-lost", "GPU lost at T1")


def test_fatal_problem_makes_devices_unhealthy_until_a_passing_recheck_after_the_quiet_period() -> None:
    tracker = HealthTracker(quiet_period=300, recheck_interval=30)
    assert tracker.observe(["gpu-0", "gpu-1"], XID79, now=1000) == [
        Transition("gpu-0", Health.UNHEALTHY, "XID 79 at T0", changed=True),
        Transition("gpu-1", Health.UNHEALTHY, "XID 79 at T0", changed=True),
    ]
    assert tracker.problems() == {"gpu-0": XID79, "gpu-1": XID79}
    assert tracker.next_recheck() == 1300
    assert tracker.due(1299.9) == []
    assert tracker.due(1300) == ["gpu-0", "gpu-1"]
    (back,) = tracker.rechecked("gpu-0", None, now=1300, wall=AT)
    assert back.health is Health.HEALTHY
    assert back.changed
    assert back.message == (
        "healthy again at 2024-06-01T12:00:00Z: no fatal event for 300s and the GPU passed its "
        "re-check (was: XID 79 at T0)"
    )
    assert tracker.problems() == {"gpu-1": XID79}


def test_a_new_fatal_event_restarts_the_quiet_period() -> None:
    tracker = HealthTracker(quiet_period=300, recheck_interval=30)
    tracker.observe(["gpu-0"], XID79, now=1000)
    # The same reason again: no new message (an event storm must not rewrite the status) ...
    assert tracker.observe(["gpu-0"], Problem("79", "XID 79 at T5"), now=1200) == []
    assert tracker.due(1300) == []  # ... but the device stays out for another quiet period
    assert tracker.next_recheck() == 1500
    # Another reason replaces the message; the device was unhealthy already.
    assert tracker.observe(["gpu-0"], LOST, now=1250) == [
        Transition("gpu-0", Health.UNHEALTHY, "GPU lost at T1", changed=False)
    ]
    assert tracker.problems() == {"gpu-0": LOST}


def test_failing_recheck_keeps_the_device_out_and_is_repeated() -> None:
    tracker = HealthTracker(quiet_period=10, recheck_interval=5)
    tracker.observe(["gpu-0"], LOST, now=0)
    (still,) = tracker.rechecked("gpu-0", "NVML GPU is lost", now=10, wall=AT)
    assert still == Transition(
        "gpu-0",
        Health.UNHEALTHY,
        "GPU lost at T1; re-check at 2024-06-01T12:00:00Z failed: NVML GPU is lost",
        changed=False,
    )
    assert tracker.next_recheck() == 15
    assert tracker.rechecked("gpu-0", "NVML GPU is lost", now=15, wall=AT + 5) == []  # same finding: quiet
    assert tracker.due(19) == []
    assert tracker.due(20) == ["gpu-0"]
    (back,) = tracker.rechecked("gpu-0", None, now=20, wall=AT + 10)
    assert back.health is Health.HEALTHY
    assert tracker.next_recheck() is None


def test_zero_quiet_period_rechecks_at_once() -> None:
    tracker = HealthTracker(quiet_period=0, recheck_interval=1)
    tracker.observe(["gpu-0"], XID79, now=7)
    assert tracker.due(7) == ["gpu-0"]


def test_timestamp_is_utc_to_the_second() -> None:
    assert timestamp(AT + 0.9) == "2024-06-01T12:00:00Z"


@pytest.mark.parametrize(
    ("xid", "action", "expected"),
    [
        (79, RecoveryAction.NONE, XidClass.INFORMATIONAL),  # NVML: nothing to do, whatever the table says
        (13, RecoveryAction.NONE, XidClass.APPLICATION),  # an application's fault stays one
        (13, RecoveryAction.GPU_RESET, XidClass.FATAL),  # NVML says the GPU needs a reset: it does
        (63, RecoveryAction.NODE_REBOOT, XidClass.FATAL),
        (94, RecoveryAction.DRAIN_P2P, XidClass.FATAL),
        (48, RecoveryAction.DRAIN_AND_RESET, XidClass.FATAL),
        (48, 42, XidClass.FATAL),  # an action newer than this code: still an action
        (13, None, XidClass.APPLICATION),  # no recovery action (older host driver): the table
        (79, None, XidClass.FATAL),
    ],
)
def test_nvmls_recovery_action_decides_where_reported(
    xid: int, action: int | None, expected: XidClass
) -> None:
    assert classify(xid, recovery=action) is expected


def test_the_operators_xid_classes_beat_the_recovery_action() -> None:
    overrides = {94: XidClass.APPLICATION, 31: XidClass.FATAL}
    assert classify(94, overrides, recovery=RecoveryAction.GPU_RESET) is XidClass.APPLICATION
    assert classify(31, overrides, recovery=RecoveryAction.NONE) is XidClass.FATAL


def test_the_recovery_action_is_in_the_message() -> None:
    reset = assess(XidEvent(GPU, 13, AT, RecoveryAction.GPU_RESET), HealthConfig()).problem
    assert reset == Problem(
        "13",
        "XID 13 (Graphics Engine Exception) at 2024-06-01T12:00:00Z: GPU reset needed (NVML recovery action)",
    )
    reboot = assess(XidEvent(GPU, 79, AT, RecoveryAction.NODE_REBOOT), HealthConfig()).problem
    assert reboot is not None
    assert reboot.message.endswith(": node reboot needed (NVML recovery action)")
    unknown = assess(XidEvent(GPU, 79, AT, 42), HealthConfig()).problem
    assert unknown is not None
    assert unknown.message.endswith(": recovery action 42 (NVML recovery action)")
    fine = assess(XidEvent(GPU, 79, AT, RecoveryAction.NONE), HealthConfig())
    assert (fine.event_class, fine.problem) == (XidClass.INFORMATIONAL, None)


def test_a_gpu_found_needing_a_recovery_action_is_a_problem() -> None:
    found = assess(RecoveryEvent(GPU, RecoveryAction.DRAIN_AND_RESET, AT), HealthConfig())
    assert found == Assessment(
        XidClass.FATAL,
        Problem(
            "recovery-action", "drain and GPU reset needed (NVML recovery action) at 2024-06-01T12:00:00Z"
        ),
    )
