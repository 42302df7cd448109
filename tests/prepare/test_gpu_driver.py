"""GpuDriver on the real fake-GPU inventory, real files and a directory claim source."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dradriver.discovery import MigDevice
from dradriver.plugin.driver import CallError, ClaimRef
from dradriver.prepare.checkpoint import CheckpointData, ClaimState
from dradriver.prepare.claims import DirectoryClaimSource, NoClaimSource
from dradriver.prepare.gpu_driver import GpuDriver
from dradriver.prepare.sharing_settings import mps_directory
from tests.helpers import allocated_claim, opaque, short_tmpdir, uid, write_gpu_profile
from tests.prepare.node import Node

TIME_SLICING_LONG: dict[str, Any] = {
    "apiVersion": "gpu.dradriver.dev/v1alpha1",
    "kind": "GpuConfig",
    "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
}


@pytest.fixture
def node() -> Iterator[Node]:
    with short_tmpdir() as root:  # short enough for the sockets MPS binds under its state dir
        yield Node(root, "dgx-h100")


@pytest.fixture
def driver(node: Node) -> Iterator[GpuDriver]:
    d = node.driver()
    yield d
    d.close()


def one_gpu(n: int, device: str = "gpu-0", **extra: object) -> dict[str, object]:
    return allocated_claim(f"claim-{n}", uid(n), [{"request": "gpu", "device": device, **extra}])


def test_prepare_writes_the_spec_and_checkpoint(node: Node, driver: GpuDriver) -> None:
    ref = node.add(one_gpu(1, "gpu-3"))
    result = driver.prepare([ref])[ref.uid]
    assert result.error == ""
    (device,) = result.devices
    assert (device.pool_name, device.device_name, device.request_names) == ("node-1", "gpu-3", ("gpu",))
    assert device.cdi_device_ids == (f"k8s.gpu.dradriver.dev/claim={ref.uid}-gpu-3",)
    spec = node.spec(ref)
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "k8s.gpu.dradriver.dev/claim"
    gpu3 = next(g for g in node.inventory.gpus if g.minor == 3)
    assert spec["devices"] == [
        {
            "name": f"{ref.uid}-gpu-3",
            "containerEdits": {
                "env": [f"DRADRIVER_DEVICE_GPU_3={gpu3.uuid}"],
                "deviceNodes": [{"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3}],
                # Its device metadata (tests/prepare/test_metadata.py).
                "mounts": [
                    {
                        "hostPath": node.metadata.file_for(ref.uid, "gpu"),
                        "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/"
                        "claim-1/gpu/gpu.dradriver.dev-metadata.json",
                        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
                    }
                ],
            },
        }
    ]
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [
            {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
            {"path": "/dev/nvidia-uvm", "type": "c", "major": 510, "minor": 0},
            {"path": "/dev/nvidia-uvm-tools", "type": "c", "major": 510, "minor": 1},
        ],
    }
    stored = node.store.load()
    assert stored is not None
    assert stored.claims[ref.uid].state is ClaimState.PREPARE_COMPLETED
    assert stored.claims[ref.uid].devices[0].uuid == gpu3.uuid


def test_prepare_is_idempotent_and_unprepare_removes_every_trace(node: Node, driver: GpuDriver) -> None:
    ref = node.add(one_gpu(1))
    first = driver.prepare([ref])
    path = node.cdi.file_for(ref.uid)
    mtime = path.stat().st_mtime_ns
    assert driver.prepare([ref]) == first
    assert path.stat().st_mtime_ns == mtime  # served from the checkpoint, nothing rewritten
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert not path.exists()
    assert node.store.load() == CheckpointData(boot_id="boot-1")
    assert driver.unprepare([ref]) == {ref.uid: ""}  # unknown claims succeed
    assert list(node.cdi.path.iterdir()) == []


def test_other_drivers_results_and_configs_are_ignored(node: Node, driver: GpuDriver) -> None:
    claim = allocated_claim(
        "mixed",
        uid(2),
        [
            {"request": "nic", "device": "eth0", "driver": "net.example.com", "pool": "elsewhere"},
            {"request": "gpu", "device": "gpu-1"},
        ],
        config=[{"source": "FromClaim", "opaque": {"driver": "net.example.com", "parameters": {"x": 1}}}],
    )
    ref = node.add(claim)
    (device,) = driver.prepare([ref])[ref.uid].devices
    assert device.device_name == "gpu-1"
    only_others = allocated_claim(
        "nic-only", uid(3), [{"request": "nic", "device": "eth0", "driver": "net.example.com"}]
    )
    ref2 = node.add(only_others)
    result = driver.prepare([ref2])[ref2.uid]
    assert (result.error, result.devices) == ("", ())
    assert not node.cdi.file_for(ref2.uid).exists()


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"device": "gpu-42"}, "was allocated device 'gpu-42', which this node does not have"),
        ({"device": "gpu-0", "pool": "node-2"}, "in pool 'node-2', but this node's pool is 'node-1'"),
    ],
)
def test_results_this_node_cannot_serve_are_per_claim_errors(
    node: Node, driver: GpuDriver, result: dict[str, object], message: str
) -> None:
    ref = node.add(allocated_claim("bad", uid(4), [{"request": "gpu", **result}]))
    outcome = driver.prepare([ref])[ref.uid]
    assert message in outcome.error
    assert outcome.error.startswith("claim default/bad:")
    assert not node.cdi.file_for(ref.uid).exists()


def test_a_device_is_never_prepared_for_two_claims(node: Node, driver: GpuDriver) -> None:
    first, second = node.add(one_gpu(5, "gpu-2")), node.add(one_gpu(6, "gpu-2"))
    assert driver.prepare([first])[first.uid].error == ""
    error = driver.prepare([second])[second.uid].error
    assert error == (
        f"claim default/claim-6: device gpu-2 is already prepared for claim default/claim-5 ({first.uid}) "
        "and cannot be shared"
    )
    monitor = node.add(one_gpu(7, "gpu-2", adminAccess=True))
    assert driver.prepare([monitor])[monitor.uid].error == ""  # admin access never conflicts
    driver.unprepare([first])
    assert driver.prepare([second])[second.uid].error == ""


class AuthoritativeClaims(DirectoryClaimSource):
    """The claim files stand in for the API server: a missing claim really was deleted."""

    authoritative = True


def test_a_holder_that_no_longer_uses_the_device_does_not_block_the_next_claim(node: Node) -> None:
    """A pod force-deleted: the scheduler gives its GPU to the next claim before the kubelet
    unprepares the old one. The old claim is unprepared at once instead of failing the new one."""
    driver = node.driver(claims=AuthoritativeClaims(node.claims_dir))
    old, new = node.add(one_gpu(5, "gpu-2")), node.add(one_gpu(6, "gpu-2"))
    assert driver.prepare([old])[old.uid].error == ""
    assert "is already prepared for claim default/claim-5" in driver.prepare([new])[new.uid].error

    released = one_gpu(5, "gpu-2")
    released["status"]["reservedFor"] = []  # type: ignore[index]
    node.add(released)
    assert driver.prepare([new])[new.uid].error == ""
    assert {r.uid for r in driver.records()} == {new.uid}
    assert node.cdi.read(old.uid) is None
    assert driver.unprepare([old]) == {old.uid: ""}  # the kubelet's late unprepare finds nothing to do

    # Deleted from the API server: the same.
    later = node.add(one_gpu(7, "gpu-2"))
    (node.claims_dir / "default.claim-6.yaml").unlink()
    assert driver.prepare([later])[later.uid].error == ""
    assert node.cdi.read(new.uid) is None
    driver.close()


def test_without_an_authority_a_holder_is_never_released(node: Node, driver: GpuDriver) -> None:
    old, new = node.add(one_gpu(5, "gpu-2")), node.add(one_gpu(6, "gpu-2"))
    assert driver.prepare([old])[old.uid].error == ""
    (node.claims_dir / "default.claim-5.yaml").unlink()
    assert "is already prepared for claim default/claim-5" in driver.prepare([new])[new.uid].error
    assert node.cdi.read(old.uid) is not None


def test_subrequest_references_are_kept_for_the_grpc_layer(node: Node, driver: GpuDriver) -> None:
    ref = node.add(allocated_claim("fa", uid(8), [{"request": "gpu/h100", "device": "gpu-4"}]))
    (device,) = driver.prepare([ref])[ref.uid].devices
    assert device.request_names == ("gpu/h100",)


def test_time_slicing_is_applied_shown_in_the_spec_and_undone(node: Node, driver: GpuDriver) -> None:
    class_config = opaque(
        {**TIME_SLICING_LONG, "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}},
        requests=["gpu"],
        source="FromClass",
    )
    claim = allocated_claim(
        "ts",
        uid(9),
        [{"request": "gpu", "device": "gpu-5"}],
        config=[class_config, opaque(TIME_SLICING_LONG)],
    )
    ref = node.add(claim)
    assert driver.prepare([ref])[ref.uid].error == ""
    gpu5 = next(g for g in node.inventory.gpus if g.minor == 5)
    assert node.sharing.timeslices == {gpu5.uuid: "Long"}  # the claim's config overrides the class's
    env = node.spec(ref)["containerEdits"]["env"]  # type: ignore[index]
    assert "DRADRIVER_TIMESLICE_INTERVAL=Long" in env
    driver.unprepare([ref])
    assert node.sharing.timeslices == {}


def test_mps_runs_the_stand_in_daemon_per_claim_and_cleans_up(node: Node, driver: GpuDriver) -> None:
    """The fake backend's MPS: a real control daemon process per claim (the stand-in), its settings
    sent through the control pipe, the pipe directory mounted into the container, all gone after."""
    mps = {
        **TIME_SLICING_LONG,
        "sharing": {
            "strategy": "MPS",
            "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
        },
    }
    ref = node.add(
        allocated_claim(
            "mps",
            uid(15),
            [{"request": "gpu", "device": "gpu-1"}, {"request": "gpu", "device": "gpu-2"}],
            config=[opaque(mps)],
        )
    )
    assert driver.prepare([ref])[ref.uid].error == ""
    pipe = node.root / "state" / "mps" / mps_directory(ref.uid) / "pipe"
    edits = node.spec(ref)["containerEdits"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]  # type: ignore[index]
    assert {"hostPath": str(pipe), "containerPath": "/tmp/nvidia-mps"}.items() <= (
        edits["mounts"][0].items()  # type: ignore[index]
    )
    uuids = [g.uuid for g in node.inventory.gpus if g.minor in (1, 2)]
    state = json.loads((pipe / "dradriver-mps-standin.json").read_text())
    assert state["devices"] == uuids  # the daemon sees the claim's GPUs only
    assert state["defaultActiveThreadPercentage"] == 50
    assert state["defaultDevicePinnedMemLimit"] == dict.fromkeys(uuids, "10240M")
    assert (pipe / "control").is_socket()
    os.kill(state["pid"], 0)  # running
    other = node.add(
        allocated_claim("mps-2", uid(16), [{"request": "gpu", "device": "gpu-3"}], config=[opaque(mps)])
    )
    assert driver.prepare([other])[other.uid].error == ""  # one daemon per claim
    assert driver.unprepare([ref, other]) == {ref.uid: "", other.uid: ""}
    assert not (node.root / "state" / "mps" / mps_directory(ref.uid)).exists()
    assert not (node.root / "state" / "mps" / mps_directory(other.uid)).exists()
    with pytest.raises(ProcessLookupError):  # quit, and reaped by the driver
        os.kill(state["pid"], 0)


def test_a_claim_with_two_mps_settings_fails_and_leaves_no_daemon(node: Node, driver: GpuDriver) -> None:
    def mps(percentage: int, request: str) -> dict[str, Any]:
        parameters = {
            **TIME_SLICING_LONG,
            "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": percentage}},
        }
        return opaque(parameters, requests=[request])

    results: list[dict[str, object]] = [
        {"request": "a", "device": "gpu-1"},
        {"request": "b", "device": "gpu-2"},
    ]
    ref = node.add(allocated_claim("two", uid(18), results, config=[mps(30, "a"), mps(60, "b")]))
    assert (
        "a claim can use one MPS setting; its requests ask for different ones"
        in driver.prepare([ref])[ref.uid].error
    )
    assert not (node.root / "state" / "mps" / mps_directory(ref.uid)).exists()


def test_mps_settings_the_daemon_refuses_fail_the_claim_and_stop_it(node: Node, driver: GpuDriver) -> None:
    mps = {
        **TIME_SLICING_LONG,
        "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "1Ki"}},
    }
    ref = node.add(
        allocated_claim("mps", uid(17), [{"request": "gpu", "device": "gpu-1"}], config=[opaque(mps)])
    )
    error = driver.prepare([ref])[ref.uid].error
    assert "pinned memory limit '0M' is not <N>M or <N>G" in error
    assert not (node.root / "state" / "mps" / mps_directory(ref.uid)).exists()
    assert not node.cdi.file_for(ref.uid).exists()


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {**TIME_SLICING_LONG, "sharing": {"strategy": "TimeSlicing", "timeslicing": {}}},
            "config[0].opaque.parameters.sharing.timeslicing: Extra inputs are not permitted",
        ),
        (
            {**TIME_SLICING_LONG, "kind": "GPUConfig"},
            "config[0].opaque.parameters.kind: must be GpuConfig or MigDeviceConfig",
        ),
        (
            {
                **TIME_SLICING_LONG,
                "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}},
            },
            "sharing.timeSlicing.interval: Input should be 'Default', 'Short', 'Medium' or 'Long'",
        ),
        (
            {**TIME_SLICING_LONG, "sharing": {"strategy": "MPS", "timeSlicing": {"interval": "Long"}}},
            "timeSlicing settings given with strategy MPS",
        ),
        (
            {
                **TIME_SLICING_LONG,
                "sharing": {"strategy": "MPS", "mps": {"perDevicePinnedMemoryLimit": {"gpu-6": "-1Gi"}}},
            },
            "perDevicePinnedMemoryLimit.gpu-6: Value error, must be",
        ),
    ],
)
def test_config_problems_are_per_claim_errors_naming_the_field(
    node: Node, driver: GpuDriver, parameters: dict[str, object], message: str
) -> None:
    ref = node.add(
        allocated_claim("cfg", uid(10), [{"request": "gpu", "device": "gpu-6"}], config=[opaque(parameters)])
    )
    error = driver.prepare([ref])[ref.uid].error
    assert message in error
    assert not node.cdi.file_for(ref.uid).exists()
    assert ref.uid not in {r.uid for r in driver.records()}
    assert node.sharing.timeslices == {}


def test_fetch_failures_fail_the_whole_call_like_the_go_helper(node: Node, driver: GpuDriver) -> None:
    missing = ClaimRef("default", "nowhere", uid(11))
    with pytest.raises(CallError, match=r"get resource claims: retrieve claim default/nowhere: .*not found"):
        driver.prepare([missing])
    unallocated = one_gpu(12)
    unallocated["status"] = {}
    with pytest.raises(CallError, match="claim default/claim-12 not allocated"):
        driver.prepare([node.add(unallocated)])
    replaced = node.add(one_gpu(13))
    with pytest.raises(CallError, match="claim default/claim-13 got replaced"):
        driver.prepare([ClaimRef(replaced.namespace, replaced.name, uid(14))])


def test_node_only_mode_is_a_per_claim_error(node: Node) -> None:
    driver = node.driver(claims=NoClaimSource())
    ref = ClaimRef("default", "c", uid(15))
    assert "no Kubernetes API access (node-only mode" in driver.prepare([ref])[ref.uid].error


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (ClaimRef("default", "c", "../../etc/passwd"), "invalid UID '../../etc/passwd'"),
        (
            ClaimRef("default", "c", "0A1B2C3D-0000-4000-8000-000000000001"),
            "must be a lowercase RFC 4122 UUID",
        ),
        (ClaimRef("Default", "c", uid(1)), "invalid namespace 'Default'"),
        (ClaimRef("default", "c/../x", uid(1)), "invalid name 'c/../x'"),
    ],
)
def test_bad_claim_references_never_touch_a_path(
    node: Node, driver: GpuDriver, ref: ClaimRef, message: str
) -> None:
    assert message in driver.prepare([ref])[ref.uid].error
    assert not node.cdi.path.exists() or not any(node.cdi.path.iterdir())


def test_mig_devices_get_their_caps_nodes(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-a100-mig")
    driver = node.driver()
    mig = next(d for d in node.devices.devices if d.json["attributes"]["type"]["string"] == "mig")
    ref = node.add(allocated_claim("mig", uid(16), [{"request": "mig", "device": mig.name}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    spec: Any = node.spec(ref)
    (device,) = spec["devices"]
    hw = mig.hardware
    assert isinstance(hw, MigDevice)
    parent, gi, ci = hw.parent_minor, hw.gi_caps_minor, hw.ci_caps_minor
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": f"/dev/nvidia{parent}", "type": "c", "major": 195, "minor": parent},
        {
            "path": f"/dev/nvidia-caps/nvidia-cap{gi}",
            "type": "c",
            "major": 236,
            "minor": gi,
            "fileMode": 0o444,
        },
        {
            "path": f"/dev/nvidia-caps/nvidia-cap{ci}",
            "type": "c",
            "major": 236,
            "minor": ci,
            "fileMode": 0o444,
        },
    ]


def test_many_claims_prepared_concurrently_each_exactly_once(tmp_path: Path) -> None:
    profile = write_gpu_profile(tmp_path / "big.yaml", 64)
    node = Node(tmp_path, str(profile))
    driver = node.driver()
    refs = [node.add(one_gpu(100 + i, f"gpu-{i}")) for i in range(50)]
    errors: list[str] = []

    def work(batch: Sequence[ClaimRef]) -> None:
        for _ in range(2):  # repeated calls race with each other too
            errors.extend(r.error for r in driver.prepare(batch).values() if r.error)

    threads = [threading.Thread(target=work, args=(refs[i::5],)) for i in range(5)]
    threads += [threading.Thread(target=work, args=(refs[::-1],))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(node.cdi.claim_uids()) == sorted(r.uid for r in refs)
    stored = node.store.load()
    assert stored is not None
    assert {u for u, r in stored.claims.items() if r.state is ClaimState.PREPARE_COMPLETED} == {
        r.uid for r in refs
    }
    for ref in refs:
        assert json.loads(node.cdi.file_for(ref.uid).read_text())["devices"][0]["name"].startswith(ref.uid)
