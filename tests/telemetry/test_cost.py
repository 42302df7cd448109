"""What a claim costs: allocated device-seconds from its prepare time, busy device-seconds from
the readings, a share weighted by its dominant fraction; the busy totals on disk; `top --by
namespace` over what serve renders."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.cli.top import NamespaceRow, namespaces_from_metrics, render_namespaces
from dradriver.prepare.checkpoint import ShareRecord
from dradriver.telemetry.cost import CostTracker, weight
from dradriver.telemetry.model import DeviceSample, Holder, PodRef, ProcessSample, Reading, Target, pod_shares
from dradriver.telemetry.sampler import Snapshot, render
from dradriver.telemetry.service import USAGE_FILE, UsageStore

GIB = 1024**3
GPU = Target("gpu-0", "GPU-0", "GPU-0", "gpu", 80 * GIB)
POD_A = PodRef("ml", "a", "0f3a5a54-5d9c-4d3e-9b1a-00000000000a")
POD_B = PodRef("web", "b", "0f3a5a54-5d9c-4d3e-9b1a-00000000000b")
WHOLE = Holder("ml", "train", "uid-1", (POD_A,), prepared_at=1000.0)


def at(util: float | None, *holders: Holder, processes: tuple[ProcessSample, ...] | None = None) -> Reading:
    sample = DeviceSample(sm_util_percent=util, processes=processes)
    reading = Reading(GPU, sample, list(holders))
    reading.shares = pod_shares(sample, list(holders), {1: POD_A.uid, 2: POD_B.uid}.get)
    return reading


@pytest.mark.parametrize(
    ("share", "admin", "expected"),
    [
        (None, False, 1.0),
        (ShareRecord(memory_mib=20480, thread_percentage=10), False, 0.25),  # memory dominates
        (ShareRecord(memory_mib=8192, thread_percentage=50), False, 0.5),  # compute dominates
        (None, True, 0.0),  # administrative access consumes nothing
    ],
)
def test_a_holder_pays_for_its_dominant_fraction(
    share: ShareRecord | None, admin: bool, expected: float
) -> None:
    holder = Holder("ml", "c", "uid", share=share, admin_access=admin)
    assert weight(holder, GPU) == expected


def test_allocated_runs_from_the_prepare_time_and_busy_integrates_the_readings() -> None:
    tracker = CostTracker({})
    (first,), changed = tracker.update(1010.0, [at(50, WHOLE)])
    # A reading of a new process counts no busy time (what came before it is unknown).
    assert (first.allocated_seconds, first.busy_seconds, changed) == (10.0, 0.0, False)
    (second,), changed = tracker.update(1020.0, [at(50, WHOLE)])
    assert (second.allocated_seconds, second.busy_seconds, changed) == (20.0, 5.0, True)
    (third,), _ = tracker.update(1030.0, [at(None, WHOLE)])  # unreadable: busy does not move
    assert (third.allocated_seconds, third.busy_seconds) == (30.0, 5.0)
    costs, changed = tracker.update(1040.0, [at(50)])  # unprepared: its total goes
    assert (costs, changed, tracker.busy) == ([], True, {})


def test_a_claim_prepared_between_readings_is_busy_from_its_prepare() -> None:
    tracker = CostTracker({})
    tracker.update(995.0, [at(100)])
    (cost,), _ = tracker.update(1004.0, [at(100, WHOLE)])
    assert (cost.allocated_seconds, cost.busy_seconds) == (4.0, 4.0)


def test_after_a_restart_busy_carries_on_from_what_was_kept() -> None:
    (cost,), changed = CostTracker({"uid-1/gpu-0": 42.0}).update(1100.0, [at(100, WHOLE)])
    assert (cost.allocated_seconds, cost.busy_seconds, changed) == (100.0, 42.0, False)


def test_a_share_is_busy_as_its_pods_processes_are_and_never_above_its_fraction() -> None:
    quarter = ShareRecord(memory_mib=20480, thread_percentage=25)
    mine = Holder("ml", "s1", "uid-1", (POD_A,), prepared_at=1000.0, share=quarter)
    other = Holder("web", "s2", "uid-2", (POD_B,), prepared_at=1000.0, share=quarter)
    processes = (ProcessSample(1, GIB, 10.0), ProcessSample(2, GIB, 60.0))
    tracker = CostTracker({})
    tracker.update(1000.0, [at(70, mine, other, processes=processes)])
    costs, _ = tracker.update(1010.0, [at(70, mine, other, processes=processes)])
    assert {c.holder.claim_name: (c.allocated_seconds, c.busy_seconds) for c in costs} == {
        "s1": (2.5, 1.0),  # 10 % of the device for 10 s
        "s2": (2.5, 2.5),  # 60 %, capped at its quarter
    }
    # Without process figures: its fraction of the device's utilisation.
    (cost, _), _ = tracker.update(1020.0, [at(40, mine, other)])
    assert cost.busy_seconds == pytest.approx(1.0 + 0.4 * 0.25 * 10)


def test_the_busy_totals_survive_on_disk_and_a_bad_file_starts_from_zero(tmp_path: Path) -> None:
    store = UsageStore(tmp_path / USAGE_FILE)
    assert store.load() == {}
    store.save({"uid-1/gpu-0": 12.5})
    assert (tmp_path / USAGE_FILE).stat().st_mode & 0o777 == 0o600
    leftover = tmp_path / f".{USAGE_FILE}.0123456789ab.tmp"  # a write killed half-way
    leftover.write_text("{")
    assert UsageStore(tmp_path / USAGE_FILE).load() == {"uid-1/gpu-0": 12.5}
    assert not leftover.exists()
    for bad in ('{"version": 1, "busy_seconds": {"x": "lots"}}', '{"busy_seconds": {"x": -1}}', "{"):
        (tmp_path / USAGE_FILE).write_text(bad)
        assert UsageStore(tmp_path / USAGE_FILE).load() == {}


def test_a_failing_write_is_logged_once_and_keeps_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "state").write_text("")  # not a directory: every write fails, also for root
    store = UsageStore(tmp_path / "state" / USAGE_FILE)
    store.save({"a": 1.0})
    store.save({"a": 2.0})
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count("cannot write the busy totals") == 1


def test_top_by_namespace_sums_what_serve_renders() -> None:
    share = Holder(
        "web",
        "s",
        "uid-2",
        (POD_B,),
        prepared_at=0.0,
        share=ShareRecord(memory_mib=20480, thread_percentage=25),
    )
    tracker = CostTracker({})
    tracker.update(0.0, [at(50, WHOLE)])
    readings = [
        at(50, WHOLE),
        Reading(Target("gpu-1", "GPU-1", "GPU-1", "gpu", 80 * GIB), DeviceSample(sm_util_percent=0), [share]),
    ]
    costs, _ = tracker.update(4600.0, readings)
    text = render(Snapshot(4600.0, 0.01, readings, costs), {}).decode()
    rows = namespaces_from_metrics(text)
    assert rows[0] == NamespaceRow("ml", 1, 1.0, 1.0, 0.5)
    assert (rows[1].namespace, rows[1].claims, rows[1].devices) == ("web", 1, 0.25)
    assert rows[1].allocated_device_hours == pytest.approx(4600 / 3600 * 0.25)
    assert rows[1].busy_device_hours == 0
    lines = render_namespaces(rows).splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].split() == ["1", "1.00", "1.000", "0.500", "50%", "ml"]
    assert lines[2].split() == ["1", "0.25", "0.319", "0.000", "0%", "web"]
    # Without tenant labels there is nothing to attribute.
    assert (
        namespaces_from_metrics(
            render(Snapshot(4600.0, 0.01, readings, costs), {}, tenant_labels=False).decode()
        )
        == []
    )
