"""FakeSharing: time slices kept in memory, MPS through the stand-in control daemon, run as the
real process it is."""

from __future__ import annotations

from dradriver.backend.fake.sharing import FakeSharing
from dradriver.prepare.sharing_settings import mps_directory
from tests.helpers import short_tmpdir
from tests.prepare.sharing_setup import UUIDS, Device, sharing


def test_time_slices_are_kept_until_release() -> None:
    with short_tmpdir() as root:
        control = FakeSharing(root / "state")
        edits = control.apply(
            "uid-1",
            sharing({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}}),
            [Device("gpu-0", UUIDS[0]), Device("gpu-1", UUIDS[1])],
        )
        assert edits.env == ("DRADRIVER_TIMESLICE_INTERVAL=Medium",)
        assert control.timeslices == {UUIDS[0]: "Medium", UUIDS[1]: "Medium"}
        control.release("uid-1", "TimeSlicing(Medium)", UUIDS)
        assert control.timeslices == {}


def test_mps_runs_the_stand_in_daemon_until_release() -> None:
    with short_tmpdir() as root:
        state = root / "state"
        control = FakeSharing(state, host_state_dir=root / "host")
        edits = control.apply("uid-1", sharing({"strategy": "MPS"}), [Device("gpu-0", UUIDS[0])])
        pipe = state / "mps" / mps_directory("uid-1") / "pipe"
        assert (pipe / "control").is_socket()
        (mount,) = edits.mounts
        assert mount.host_path == str(root / "host" / "mps" / mps_directory("uid-1") / "pipe")
        control.release("uid-1", "MPS", [UUIDS[0]])
        assert not pipe.parent.exists()
        control.release("uid-1", "MPS", [UUIDS[0]])  # repeated after a crash: nothing left to do
