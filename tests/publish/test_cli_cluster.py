"""CLI commands that talk to an API server: `dry-run --cluster` and `slices --delete`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from dradriver.slices import build_node_slices
from tests.publish.apiservers import TEST_DRIVER
from tests.publish.kubefake import FakeApiServer

A = f'device.attributes["{TEST_DRIVER}"]'


def dradriver(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRADRIVER_") and k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "dradriver", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_dry_run_reads_slices_and_classes_from_the_cluster(fake_api: FakeApiServer, tmp_path: Path) -> None:
    for slice_ in build_node_slices("dgx-h100", node_name="node-a", driver_name=TEST_DRIVER):
        slice_["metadata"] = {"name": slice_["metadata"]["generateName"] + "x"}
        fake_api.create("resourceslices", None, slice_)
    fake_api.create(
        "deviceclasses",
        None,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "h100"},
            "spec": {"selectors": [{"cel": {"expression": f'{A}.productName.startsWith("NVIDIA H100")'}}]},
        },
    )
    claim = tmp_path / "claim.yaml"
    claim.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "two", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "h100", "count": 2}}]
                    }
                },
            }
        )
    )
    kubeconfig = str(tmp_path / "kubeconfig")
    args = ["--claim", str(claim), "--cluster", "--kubeconfig", kubeconfig, "--driver-name", TEST_DRIVER]
    result = dradriver("dry-run", *args, "-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["satisfiable"] is True
    too_many = claim.read_text().replace("count: 2", "count: 9")
    claim.write_text(too_many)
    result = dradriver(
        "dry-run",
        "--claim",
        str(claim),
        "--cluster",
        "--kubeconfig",
        kubeconfig,
        "--driver-name",
        TEST_DRIVER,
    )
    assert result.returncode == 1


def test_slices_delete_removes_only_this_nodes_slices(fake_api: FakeApiServer, tmp_path: Path) -> None:
    for node in ("node-a", "node-b"):
        for slice_ in build_node_slices("t4x4", node_name=node, driver_name=TEST_DRIVER):
            slice_["metadata"] = {"name": slice_["metadata"]["generateName"] + "x"}
            fake_api.create("resourceslices", None, slice_)
    kubeconfig = str(tmp_path / "kubeconfig")
    result = dradriver(
        "slices",
        "--delete",
        "--node-name",
        "node-a",
        "--driver-name",
        TEST_DRIVER,
        "--kubeconfig",
        kubeconfig,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"deleted 1 ResourceSlice(s) of driver {TEST_DRIVER} on node node-a\n"
    assert [s["spec"]["nodeName"] for s in fake_api.objects("resourceslices")] == ["node-b"]
