"""MIG devices created on prepare and destroyed on unprepare, in process, on fake GPUs.

The node is `a100-mig-empty` with --partitionable: GPU 0 is in MIG mode with no MIG devices, so
every claim for a MIG placement there makes prepare create the GPU and compute instance.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.backend.fake.mig import STATE_FILE, FakeMigControl
from dradriver.discovery import MigPlacement
from dradriver.mig import MigError
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import CheckpointData, ClaimRecord, ClaimState, DeviceRecord, MigRecord
from dradriver.prepare.claims import ClaimNotFoundError
from dradriver.prepare.gpu_driver import GpuDriver
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.sharing_settings import SharingError
from dradriver.prepare.stale import StaleClaimCollector
from tests.helpers import allocated_claim, opaque, uid
from tests.prepare.node import Node

MPS: dict[str, object] = {
    "apiVersion": "gpu.dradriver.dev/v1alpha1",
    "kind": "MigDeviceConfig",
    "sharing": {"strategy": "MPS"},
}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path, "a100-mig-empty", partitionable=True)


@pytest.fixture
def driver(node: Node) -> Iterator[GpuDriver]:
    d = node.driver()
    yield d
    d.close()


def mig_claim(n: int, device: str, **extra: Any) -> dict[str, Any]:
    return allocated_claim(f"mig-{n}", uid(n), [{"request": "mig", "device": device}], **extra)


def gpu_instances(node: Node) -> list[tuple[int, int, str | None]]:
    """(GPU instance id, placement start, compute instance UUID) the fake GPU 0 holds."""
    control = FakeMigControl(node.inventory, node.root / "state" / STATE_FILE)
    return sorted((i.id, i.start, i.compute) for i in control._state.instances)


def test_prepare_creates_the_mig_device_and_unprepare_destroys_it(node: Node, driver: GpuDriver) -> None:
    ref = node.add(mig_claim(1, "gpu-0-mig-3g40gb-4"))
    result = driver.prepare([ref])[ref.uid]
    assert result.error == ""
    [(gi, start, mig_uuid)] = gpu_instances(node)
    assert start == 4
    assert mig_uuid is not None
    # The spec names the new MIG device: its UUID and its GPU and compute instance access nodes.
    spec: Any = node.spec(ref)
    [device] = spec["devices"]
    edits = device["containerEdits"]
    assert edits["env"] == [f"DRADRIVER_DEVICE_GPU_0_MIG_3G40GB_4={mig_uuid}"]
    caps = [n["minor"] for n in edits["deviceNodes"][1:]]
    assert caps == [3 + gi * 9, 3 + gi * 9 + 1]  # the driver's nvidia-caps layout for GPU 0
    stored = node.store.load()
    assert stored is not None
    [record] = stored.claims[ref.uid].devices
    assert record.uuid == mig_uuid
    assert record.mig is not None
    assert (record.mig.gi_id, record.mig.ci_id, record.mig.placement_start) == (gi, 0, 4)
    assert stored.created_gpu_instances() == {(node.inventory.gpus[0].uuid, gi): "gpu-0-mig-3g40gb-4"}
    assert Ledger(node.store, node.boot_id).created_on_disk() == stored.created_gpu_instances()
    assert driver.prepare([ref])[ref.uid] == result  # idempotent: nothing created twice
    assert len(gpu_instances(node)) == 1

    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert gpu_instances(node) == []
    assert (node.mig_metrics.created, node.mig_metrics.destroyed, node.mig_metrics.failures) == (1, 1, [])


def test_3g_and_4g_on_one_gpu_are_distinct_new_mig_devices(node: Node, driver: GpuDriver) -> None:
    small, large = node.add(mig_claim(2, "gpu-0-mig-3g40gb-4")), node.add(mig_claim(3, "gpu-0-mig-4g40gb-0"))
    assert driver.prepare([small, large]) == {
        small.uid: driver.prepare([small])[small.uid],
        large.uid: driver.prepare([large])[large.uid],
    }
    instances = gpu_instances(node)
    assert [start for _, start, _ in instances] == [0, 4] or [start for _, start, _ in instances] == [4, 0]
    assert len({mig for _, _, mig in instances}) == 2
    uuids = {d.uuid for r in driver.records() for d in r.devices}
    assert uuids == {mig for _, _, mig in instances}


def test_no_room_at_the_placement_is_a_per_claim_error_and_leaves_nothing(
    node: Node, driver: GpuDriver
) -> None:
    """An operator made a MIG device after our slices were published: NVML has no room left."""
    gpu = node.inventory.gpus[0]
    operator = FakeMigControl(node.inventory, node.root / "state" / STATE_FILE)
    one_g = next(p for p in gpu.mig_profiles if p.name == "1g.10gb")
    operators_gi = operator.create_gpu_instance(gpu, one_g, MigPlacement(5, 1))
    operator.create_compute_instance(gpu, operators_gi)
    ref = node.add(mig_claim(4, "gpu-0-mig-3g40gb-4"))
    error = driver.prepare([ref])[ref.uid].error
    assert error.startswith("claim default/mig-4: cannot create the MIG device: ")
    assert "overlaps a GPU instance" in error
    assert [gi for gi, _, _ in gpu_instances(node)] == [operators_gi]  # the operator's stays
    assert node.store.load().claims == {}  # type: ignore[union-attr]
    assert not node.cdi.file_for(ref.uid).exists()
    assert node.mig_metrics.failures == [("create", "insufficient_resources")]


class FailingSharing:
    """MPS whose control daemon cannot be started."""

    def apply(self, claim_uid: str, sharing: object, devices: object) -> object:
        raise SharingError("MPS cannot be applied: nvidia-cuda-mps-control exited with 1")

    def release(self, claim_uid: str, description: str, uuids: object) -> None:
        """Nothing was started."""


def test_a_sharing_failure_rolls_the_new_mig_device_back(node: Node) -> None:
    """The MIG device made for the claim is destroyed again when its sharing cannot be applied."""
    node.sharing = FailingSharing()  # type: ignore[assignment]
    driver = node.driver()
    ref = node.add(mig_claim(5, "gpu-0-mig-2g20gb-4", config=[opaque(MPS, requests=["mig"])]))
    error = driver.prepare([ref])[ref.uid].error
    assert "MPS cannot be applied" in error
    assert gpu_instances(node) == []
    assert (node.mig_metrics.created, node.mig_metrics.destroyed) == (1, 1)
    driver.close()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {**MPS, "sharing": {"strategy": "TimeSlicing"}},
            "MIG devices are isolated partitions: TimeSlicing cannot be applied; use MPS",
        ),
        (
            {
                "apiVersion": "gpu.dradriver.dev/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing"},
            },
            "a GpuConfig with TimeSlicing applies to gpu-0-mig-1g10gb-6, which are MIG devices, so it would "
            "do nothing; use MigDeviceConfig",
        ),
    ],
    ids=["time-slicing a MIG device", "GpuConfig on a MIG device"],
)
def test_sharing_that_cannot_apply_to_a_mig_device_is_an_error_not_ignored(
    node: Node, driver: GpuDriver, config: dict[str, Any], message: str
) -> None:
    ref = node.add(mig_claim(6, "gpu-0-mig-1g10gb-6", config=[opaque(config)]))
    assert message in driver.prepare([ref])[ref.uid].error
    assert gpu_instances(node) == []  # refused before anything was created


def test_a_claim_gone_from_the_api_server_gets_its_mig_device_destroyed(
    node: Node, driver: GpuDriver
) -> None:
    ref = node.add(mig_claim(7, "gpu-0-mig-7g80gb-0"))
    assert driver.prepare([ref])[ref.uid].error == ""

    class Gone:
        authoritative = True
        remote = True

        def get(self, namespace: str, name: str) -> Any:
            raise ClaimNotFoundError(f"{namespace}/{name} not found")

    assert StaleClaimCollector(driver, Gone(), grace=0).check_once() == [ref.uid]
    assert gpu_instances(node) == []


def crash_state(node: Node, ref: ClaimRef, *, recorded: bool, compute: bool) -> int:
    """What a kill -9 during prepare leaves: the claim PrepareStarted with the intent to create a
    3g.40gb at 0 (and the GPU instance id if `recorded`), and that GPU instance on the GPU (with its
    compute instance if `compute`)."""
    gpu = node.inventory.gpus[0]
    three_g = next(p for p in gpu.mig_profiles if p.name == "3g.40gb")
    control = FakeMigControl(node.inventory, node.root / "state" / STATE_FILE)
    gi = control.create_gpu_instance(gpu, three_g, MigPlacement(0, 4))
    if compute:
        control.create_compute_instance(gpu, gi)
    record = ClaimRecord(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=ClaimState.PREPARE_STARTED,
        devices=(
            DeviceRecord(
                pool="node-1",
                device="gpu-0-mig-3g40gb-0",
                mig=MigRecord(
                    parent_uuid=gpu.uuid,
                    profile="3g.40gb",
                    profile_id=three_g.profile_id,
                    placement_start=0,
                    placement_size=4,
                    gi_id=gi if recorded else None,
                ),
            ),
        ),
    )
    node.store.save(CheckpointData(boot_id=node.boot_id, claims={ref.uid: record}))
    return gi


@pytest.mark.parametrize(
    ("recorded", "compute"),
    [(True, False), (False, False), (True, True)],
    ids=["between the instances", "before the id was recorded", "before PrepareCompleted"],
)
def test_recovery_destroys_what_a_crash_during_prepare_left(
    node: Node, recorded: bool, compute: bool
) -> None:
    ref = ClaimRef("default", "crashed", uid(8))
    crash_state(node, ref, recorded=recorded, compute=compute)
    driver = node.driver(recover=False)
    assert driver.recover().rolled_back == [ref.uid]
    assert gpu_instances(node) == []
    assert driver.records() == []


def test_recovery_never_touches_a_gpu_instance_it_did_not_make(node: Node) -> None:
    """Our GPU instance is gone and an operator's sits at the placement under another id."""
    ref = ClaimRef("default", "crashed", uid(9))
    gi = crash_state(node, ref, recorded=True, compute=False)
    stored = node.store.load()
    assert stored is not None
    device = stored.claims[ref.uid].devices[0]
    assert device.mig is not None
    other = device.mig.model_copy(update={"gi_id": gi + 1})
    record = stored.claims[ref.uid].model_copy(
        update={"devices": (device.model_copy(update={"mig": other}),)}
    )
    node.store.save(CheckpointData(boot_id=node.boot_id, claims={ref.uid: record}))
    assert node.driver(recover=False).recover().rolled_back == [ref.uid]
    assert [i for i, _, _ in gpu_instances(node)] == [gi]


def test_a_mig_device_still_in_use_fails_unprepare_until_it_is_free(node: Node, driver: GpuDriver) -> None:
    """NVML refuses to destroy a compute instance with processes on it (IN_USE): unprepare fails,
    the claim stays prepared and recorded, and the kubelet's retry succeeds once it is free."""
    ref = node.add(mig_claim(10, "gpu-0-mig-1g20gb-6"))
    assert driver.prepare([ref])[ref.uid].error == ""
    busy = [True]

    class Busy(FakeMigControl):
        def destroy(self, gpu_uuid: str, gpu_instance: int) -> bool:
            if busy[0]:
                raise MigError("in_use", "nvmlComputeInstanceDestroy: In use by another client")
            return super().destroy(gpu_uuid, gpu_instance)

    driver._mig._control = Busy(node.inventory, node.root / "state" / STATE_FILE)
    error = driver.unprepare([ref])[ref.uid]
    assert error == "claim default/mig-10: nvmlComputeInstanceDestroy: In use by another client"
    assert [r.uid for r in driver.records()] == [ref.uid]
    assert node.cdi.file_for(ref.uid).exists()
    assert node.mig_metrics.failures == [("destroy", "in_use")]
    busy[0] = False
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert gpu_instances(node) == []


def test_serve_on_fake_gpus_creates_mig_devices_and_keeps_them_across_a_restart() -> None:
    """`serve --fake-gpus a100-mig-empty --partitionable` over gRPC, killed and restarted in between."""
    import json
    import signal

    import yaml

    from dradriver.kubeletclient import DRAClient
    from tests.helpers import ServeProcess, short_tmpdir

    with short_tmpdir() as root:
        serve = ServeProcess(root, ["--partitionable"], fake_gpus="a100-mig-empty")
        serve.claims_dir.mkdir(exist_ok=True)
        refs = []
        for n, device in ((20, "gpu-0-mig-3g40gb-4"), (21, "gpu-0-mig-4g40gb-0")):
            (serve.claims_dir / f"{n}.yaml").write_text(yaml.safe_dump(mig_claim(n, device)))
            refs.append(ClaimRef("default", f"mig-{n}", uid(n)))
        state = serve.plugins_dir / "gpu.dradriver.dev" / STATE_FILE
        try:
            serve.start()
            with DRAClient(serve.dra_socket) as client:
                response = client.prepare(refs)
                assert [response.claims[r.uid].error for r in refs] == ["", ""]
            made = json.loads(state.read_text())["instances"]
            assert sorted(i["start"] for i in made) == [0, 4]
            assert all(i["compute"] for i in made)
            serve.stop(signal.SIGKILL)
            serve.start()
            with DRAClient(serve.dra_socket) as client:
                client.wait_ready(20)  # the killed process left its socket file behind
                response = client.unprepare(refs)
                assert [response.claims[r.uid].error for r in refs] == ["", ""]
            assert json.loads(state.read_text())["instances"] == []
        finally:
            serve.kill()


def test_an_xid_in_a_mig_device_made_on_demand_marks_that_device_unhealthy() -> None:
    """fake-event on the placement of a MIG device serve created reaches the kubelet's health
    stream for that device only (the event names its GPU instance, as NVML's would)."""
    import yaml

    from dradriver.health.board import Health
    from dradriver.kubeletclient import DRAClient
    from tests.health.test_serve_health import fake_event, serving

    # The later --fake-gpus wins over the default profile of the health tests.
    with serving(["--partitionable", "--fake-gpus", "a100-mig-empty"]) as (serve, stream):
        serve.claims_dir.mkdir(exist_ok=True)
        (serve.claims_dir / "c.yaml").write_text(yaml.safe_dump(mig_claim(30, "gpu-0-mig-2g20gb-4")))
        ref = ClaimRef("default", "mig-30", uid(30))
        with DRAClient(serve.dra_socket) as client:
            assert client.prepare([ref]).claims[ref.uid].error == ""
        sent = fake_event(serve, "--device", "gpu-0-mig-2g20gb-4", "--xid", "79")
        assert sent.returncode == 0, sent.stderr
        assert stream.wait("gpu-0-mig-2g20gb-4", Health.UNHEALTHY).startswith("XID 79")
        assert stream.latest["gpu-0-mig-2g20gb-2"][0] == Health.HEALTHY
