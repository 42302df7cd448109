"""Device metadata (KEP-5304) of prepared claims: the files, their place in the containers, their
life with the claim, and recovery's part; GpuDriver on real files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dradriver.devicemodel.shares import SharePolicy
from dradriver.prepare.checkpoint import CheckpointStore
from dradriver.prepare.gpu_share_daemons import ShareDaemons
from dradriver.prepare.metadata import API_VERSIONS, CONTAINER_DIR
from tests.helpers import DRIVER, allocated_claim, uid
from tests.prepare.node import Node

V1BETA1, V1ALPHA1 = API_VERSIONS
STATE = "device-metadata"


def stream(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a metadata file, as a reader decodes the stream."""
    text, decoder, objects, at = path.read_text(), json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        obj, end = decoder.raw_decode(text, at)
        objects.append(obj)
        at = end + 1
    return objects


def mounts(spec: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each CDI device's mounts, by device name suffix."""
    return {d["name"].split("-", 5)[-1]: d["containerEdits"].get("mounts", []) for d in spec["devices"]}


def test_a_gpu_claim_gets_its_metadata_mounted_read_only(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    ref = node.add(allocated_claim("train", uid(1), [{"request": "gpu", "device": "gpu-3"}]))
    assert driver.prepare([ref])[ref.uid].error == ""

    path = tmp_path / STATE / f"{ref.uid}_gpu.json"
    beta, alpha = stream(path)
    assert [beta["apiVersion"], alpha["apiVersion"]] == [V1BETA1, V1ALPHA1]
    assert {k: v for k, v in alpha.items() if k != "apiVersion"} == {
        k: v for k, v in beta.items() if k != "apiVersion"
    }
    assert beta["kind"] == "DeviceMetadata"
    assert beta["metadata"] == {"name": "train", "namespace": "default", "uid": ref.uid, "generation": 1}
    assert "podClaimName" not in beta
    ((request,),) = [beta["requests"]]
    assert request["name"] == "gpu"
    ((device,),) = [request["devices"]]
    gpu3 = next(g for g in node.inventory.gpus if g.minor == 3)
    assert {k: device[k] for k in ("driver", "pool", "name")} == {
        "driver": DRIVER,
        "pool": "node-1",
        "name": "gpu-3",
    }
    attributes = device["attributes"]
    # What the slice publishes for gpu-3, UUID, PCI bus id and the standard NUMA node included.
    assert attributes == node.devices.get("gpu-3").json["attributes"]  # type: ignore[union-attr]
    assert attributes["uuid"] == {"string": gpu3.uuid}
    assert attributes["resource.kubernetes.io/pciBusID"] == {"string": gpu3.pci_bus_id}
    assert attributes["resource.kubernetes.io/numaNode"] == {"int": gpu3.numa_node}
    assert oct(path.stat().st_mode & 0o777) == "0o644"

    (mount,) = mounts(node.spec(ref))["gpu-3"]
    assert mount["hostPath"] == str(path)
    assert mount["containerPath"] == f"{CONTAINER_DIR}/resourceclaims/train/gpu/{DRIVER}-metadata.json"
    assert "ro" in mount["options"]
    (record,) = driver.records()
    assert record.metadata == {"gpu": {k: v for k, v in beta.items() if k not in ("kind", "apiVersion")}}

    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert list((tmp_path / STATE).iterdir()) == []


def test_a_template_claims_metadata_is_placed_by_its_pod_claim_name(tmp_path: Path) -> None:
    """Per request, with the subrequest the allocation chose; each device mounts its request's file."""
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    claim = allocated_claim(
        "worker-0-gpus-x7k2p",
        uid(2),
        [{"request": "big/h100", "device": "gpu-0"}, {"request": "small", "device": "gpu-1"}],
    )
    claim["metadata"]["annotations"] = {  # type: ignore[index]
        "resource.kubernetes.io/pod-claim-name": "gpus",
        "example.com/other": "ignored",
    }
    ref = node.add(claim)
    assert driver.prepare([ref])[ref.uid].error == ""

    by_device = mounts(node.spec(ref))
    template_dir = f"{CONTAINER_DIR}/resourceclaimtemplates/gpus"
    assert [m["containerPath"] for m in by_device["gpu-0"]] == [f"{template_dir}/big/{DRIVER}-metadata.json"]
    assert [m["containerPath"] for m in by_device["gpu-1"]] == [
        f"{template_dir}/small/{DRIVER}-metadata.json"
    ]
    big, _ = stream(tmp_path / STATE / f"{ref.uid}_big.json")
    assert big["podClaimName"] == "gpus"
    assert big["metadata"]["name"] == "worker-0-gpus-x7k2p"
    assert [(r["name"], [d["name"] for d in r["devices"]]) for r in big["requests"]] == [
        ("big/h100", ["gpu-0"])
    ]
    small, _ = stream(tmp_path / STATE / f"{ref.uid}_small.json")
    assert [d["name"] for d in small["requests"][0]["devices"]] == ["gpu-1"]


def test_a_mig_device_made_at_prepare_is_described_with_its_uuid(tmp_path: Path) -> None:
    node = Node(tmp_path, "a100-mig-empty", partitionable=True)
    driver = node.driver()
    ref = node.add(allocated_claim("mig", uid(3), [{"request": "mig", "device": "gpu-0-mig-3g40gb-4"}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    ((device,),) = [r.devices for r in driver.records()]
    beta, _ = stream(tmp_path / STATE / f"{ref.uid}_mig.json")
    attributes = beta["requests"][0]["devices"][0]["attributes"]
    assert device.uuid.startswith("MIG-")
    assert attributes["uuid"] == {"string": device.uuid}
    assert attributes["profile"] == {"string": "3g.40gb"}
    assert attributes["parentUUID"] == {"string": node.inventory.gpus[0].uuid}
    assert driver.unprepare([ref]) == {ref.uid: ""}
    assert list((tmp_path / STATE).iterdir()) == []


def test_two_shares_of_one_gpu_each_get_their_own_metadata(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver(shares=ShareDaemons(SharePolicy("unenforced")))
    refs = []
    for n in (4, 5):
        result: dict[str, object] = {
            "request": "gpu",
            "device": "gpu-0",
            "shareID": f"5a4e0000-0000-4000-8000-{n:012d}",
            "consumedCapacity": {"memory": "10Gi", "computePercent": "50"},
        }
        refs.append(node.add(allocated_claim(f"share-{n}", uid(n), [result])))
    assert [r.error for r in driver.prepare(refs).values()] == ["", ""]
    for ref in refs:
        beta, _ = stream(tmp_path / STATE / f"{ref.uid}_gpu.json")
        assert beta["metadata"]["name"] == ref.name
        assert beta["requests"][0]["devices"][0]["attributes"]["uuid"] == {
            "string": node.inventory.gpus[0].uuid
        }
        (mount,) = next(iter(mounts(node.spec(ref)).values()))
        assert (
            mount["containerPath"] == f"{CONTAINER_DIR}/resourceclaims/{ref.name}/gpu/{DRIVER}-metadata.json"
        )


def test_switched_off_no_file_and_no_mount(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100", device_metadata=False)
    driver = node.driver()
    ref = node.add(allocated_claim("plain", uid(6), [{"request": "gpu", "device": "gpu-0"}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    assert mounts(node.spec(ref)) == {"gpu-0": []}
    assert not (tmp_path / STATE).exists()
    assert driver.records()[0].metadata is None


@pytest.mark.parametrize(
    ("annotation", "request_name", "problem"),
    [
        ("../../etc", "gpu", "annotation resource.kubernetes.io/pod-claim-name '../../etc'"),
        (None, "Gpu_1", "request 'Gpu_1'"),
    ],
)
def test_a_name_that_is_no_path_segment_fails_the_claim_with_nothing_written(
    tmp_path: Path, annotation: str | None, request_name: str, problem: str
) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    claim = allocated_claim("odd", uid(7), [{"request": request_name, "device": "gpu-0"}])
    if annotation is not None:
        claim["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": annotation}  # type: ignore[index]
    ref = node.add(claim)
    error = driver.prepare([ref])[ref.uid].error
    assert error.startswith(f"claim {ref}: {problem}: "), error
    assert driver.records() == []
    assert node.cdi.read(ref.uid) is None
    assert not (tmp_path / STATE).exists()


def test_metadata_that_cannot_be_written_fails_the_claim_and_rolls_it_back(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    ref = node.add(allocated_claim("blocked", uid(8), [{"request": "gpu", "device": "gpu-0"}]))
    (tmp_path / STATE).mkdir(parents=True)
    (tmp_path / STATE / f"{ref.uid}_gpu.json").mkdir()  # a directory where its file goes
    error = driver.prepare([ref])[ref.uid].error
    assert error.startswith(f"claim {ref}: cannot write the device metadata in {tmp_path / STATE}: "), error
    assert driver.records() == []
    assert node.cdi.read(ref.uid) is None
    # The kubelet's retry goes through once the obstacle is gone.
    (tmp_path / STATE / f"{ref.uid}_gpu.json").rmdir()
    assert driver.prepare([ref])[ref.uid].error == ""


def test_recovery_rewrites_a_claims_metadata_and_removes_what_no_claim_keeps(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    kept = node.add(allocated_claim("kept", uid(9), [{"request": "gpu", "device": "gpu-0"}]))
    tampered = node.add(allocated_claim("tampered", uid(10), [{"request": "gpu", "device": "gpu-1"}]))
    assert [r.error for r in driver.prepare([kept, tampered]).values()] == ["", ""]
    files = {ref.uid: tmp_path / STATE / f"{ref.uid}_gpu.json" for ref in (kept, tampered)}
    written = {uid_: path.read_bytes() for uid_, path in files.items()}
    files[kept.uid].unlink()
    files[tampered.uid].write_text("{}")
    orphan = tmp_path / STATE / f"{uid(11)}_gpu.json"  # a crash between its files and its record
    orphan.write_text("{}")
    leftover = tmp_path / STATE / f".{kept.uid}_gpu.json.0123456789ab.tmp"
    leftover.write_text("half")
    driver.close()

    restarted = node.driver(recover=False)
    report = restarted.recover()
    assert sorted(report.metadata_rewritten) == sorted([kept.uid, tampered.uid])
    assert report.metadata_removed == [uid(11)]
    assert {uid_: path.read_bytes() for uid_, path in files.items()} == written
    assert not orphan.exists()
    assert not leftover.exists()
    # A repeated prepare also puts back what was lost since.
    files[kept.uid].unlink()
    assert restarted.prepare([kept])[kept.uid].error == ""
    assert files[kept.uid].read_bytes() == written[kept.uid]


def test_a_reboot_voids_the_previous_boots_metadata(tmp_path: Path) -> None:
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    ref = node.add(allocated_claim("old", uid(12), [{"request": "gpu", "device": "gpu-0"}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    driver.close()
    node.boot_id = "boot-2"
    report = node.driver(recover=False).recover()
    assert report.metadata_removed == [ref.uid]
    assert list((tmp_path / STATE).iterdir()) == []
    assert CheckpointStore(tmp_path / "state").load().claims == {}  # type: ignore[union-attr]


def test_a_restart_keeps_intact_metadata_as_it_is(tmp_path: Path) -> None:
    """What the checkpoint gives back encodes to the very bytes written: nothing is rewritten."""
    node = Node(tmp_path, "dgx-h100")
    driver = node.driver()
    ref = node.add(allocated_claim("steady", uid(13), [{"request": "gpu", "device": "gpu-2"}]))
    assert driver.prepare([ref])[ref.uid].error == ""
    driver.close()
    report = node.driver(recover=False).recover()
    assert (report.metadata_rewritten, report.metadata_removed) == ([], [])
    assert (tmp_path / STATE / f"{ref.uid}_gpu.json").is_file()
