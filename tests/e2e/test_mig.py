"""MIG on demand with the real scheduler: `serve --partitionable` on `a100-mig-empty` (GPU 0 in MIG
mode with no MIG devices, GPU 1 with MIG off), as the `fake` DaemonSet.

3g.40gb and 4g.40gb for two pods land on GPU 0 as two newly created MIG devices; a third MIG claim
that no longer fits stays Pending with the scheduler's reason; a whole-GPU claim gets GPU 1, never
the GPU in MIG mode, and reads GPU 1's UUID and PCI bus id in its device metadata file;
deleting the pods destroys the MIG devices. `dradriver dry-run --cluster`, run before each step
against the same API server, predicts each outcome. Then an unchanged device-plugin pod asking
`nvidia.com/mig-1g.10gb: 1` gets a 1g.10gb MIG device made for it, described in its metadata.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import EXAMPLES
from tests.e2e.plugin import DRIVER, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import (
    check_container,
    load,
    pods_of,
    promised,
    unschedulable,
    wait_pods,
    wait_unprepared,
)

pytestmark = pytest.mark.cluster


def dry_run(cluster: RealCluster, path: Path) -> int:
    """`dradriver dry-run --cluster` for the claims in `path`, against the live cluster's state."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dradriver",
            "dry-run",
            "--cluster",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--claim",
            str(path),
            "--node",
            cluster.node_name,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode


def allocated_devices(cluster: RealCluster, pod: dict[str, Any]) -> list[str]:
    devices = []
    for status in pod["status"].get("resourceClaimStatuses", []):
        claim = cluster.get_json(
            "resourceclaim", "-n", pod["metadata"]["namespace"], status["resourceClaimName"]
        )
        devices += [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]  # type: ignore[index]
    return devices


def created_mig(deployment: Deployment) -> list[dict[str, Any]]:
    return [d for c in deployment.status()["claims"] for d in c["devices"] if "createdMig" in d]


def running(cluster: RealCluster, documents: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    return wait_pods(cluster, documents, lambda p: p["status"].get("phase") == "Running", 120, what)


def test_mig_devices_are_made_for_the_scheduler_s_choice_and_destroyed_after(
    real_cluster: RealCluster, fake_deployment: Deployment, tmp_path: Path
) -> None:
    fake_deployment.set_env(DRADRIVER_FAKE_GPUS="a100-mig-empty", DRADRIVER_PARTITIONABLE="true")
    pair = EXAMPLES / "mig-on-demand.yaml"
    assert dry_run(real_cluster, pair) == 0
    real_cluster.kubectl("apply", "-f", str(pair))
    documents = load(pair)
    pods = running(real_cluster, documents, "the 3g.40gb and 4g.40gb pods Running")
    devices = sorted(d for pod in pods for d in allocated_devices(real_cluster, pod))
    assert devices == ["gpu-0-mig-3g40gb-4", "gpu-0-mig-4g40gb-0"]
    made = created_mig(fake_deployment)
    assert sorted(d["device"] for d in made) == devices
    uuids = {d["uuid"] for d in made}
    assert len(uuids) == 2
    assert all(u.startswith("MIG-") for u in uuids)
    for pod in pods:
        for promise in promised(real_cluster, fake_deployment, pod):
            check_container(real_cluster, promise)
            assert len([p for p in promise.device_nodes if p.startswith("/dev/nvidia-caps/")]) == 2

    # No placement of a 7-slice A100 is free any more: a third MIG claim cannot be allocated.
    third = tmp_path / "third.yaml"
    documents_third = load(EXAMPLES / "mig-profile.yaml")
    third.write_text(yaml.safe_dump_all(documents_third))
    assert dry_run(real_cluster, third) == 1
    real_cluster.kubectl("apply", "-f", str(third))
    (pending,) = wait_pods(real_cluster, documents_third, unschedulable, 60, "the third MIG pod held back")
    message = next(c["message"] for c in pending["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "cannot allocate all claims" in message

    # A whole GPU is only ever the one with MIG off.
    whole = EXAMPLES / "single-gpu.yaml"
    assert dry_run(real_cluster, whole) == 0
    real_cluster.kubectl("apply", "-f", str(whole))
    (gpu_pod,) = running(real_cluster, load(whole), "the whole-GPU pod Running")
    assert allocated_devices(real_cluster, gpu_pod) == ["gpu-1"]
    # Its device metadata (KEP-5304), at the path for a claim from a template: GPU 1 as published.
    published = published_attributes(real_cluster, "gpu-1")
    metadata = read_metadata(real_cluster, gpu_pod, "resourceclaimtemplates/gpu/gpu")
    assert metadata["podClaimName"] == "gpu"
    (device,) = metadata["requests"][0]["devices"]
    assert device["name"] == "gpu-1"
    for name in ("uuid", "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/numaNode"):
        assert device["attributes"][name] == published[name], name

    for path in (third, whole, pair):
        real_cluster.kubectl("delete", "-f", str(path), "--wait=true", "--timeout=90s", timeout=120)
    wait(lambda: not any(pods_of(real_cluster, load(p)) for p in (third, whole, pair)), 60, "the pods to go")
    wait_unprepared(fake_deployment)
    assert created_mig(fake_deployment) == []
    # The fake GPUs' own record of their GPU instances (what NVML would list) is empty again.
    state = json.loads(
        fake_deployment.exec("cat", f"/var/lib/kubelet/plugins/{DRIVER}/fake-mig-devices.json")
    )
    assert state["instances"] == []

    # An unchanged device-plugin pod asking nvidia.com/mig-1g.10gb (the optional classes of
    # deviceclasses/optional/mig-profiles.yaml, in the release's deviceclasses-optional.yaml): the
    # scheduler's claim of mig-1g-10gb.gpu.dradriver.dev gets a 1g.10gb MIG device, made for it.
    optional_classes = str(fake_deployment.release.optional_device_classes)
    real_cluster.kubectl("apply", "-f", optional_classes)
    plugin_pod = tmp_path / "device-plugin-pod.yaml"
    plugin_pod.write_text(yaml.safe_dump(DEVICE_PLUGIN_POD))
    real_cluster.kubectl("apply", "-f", str(plugin_pod))
    (mig_pod,) = running(real_cluster, [DEVICE_PLUGIN_POD], "the nvidia.com/mig-1g.10gb pod Running")
    status = mig_pod["status"]["extendedResourceClaimStatus"]
    (mapping,) = status["requestMappings"]
    assert mapping["resourceName"] == "nvidia.com/mig-1g.10gb"
    claim: Any = real_cluster.get_json("resourceclaim", "-n", "default", status["resourceClaimName"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"].startswith("gpu-0-mig-1g10gb-")
    (made_mig,) = created_mig(fake_deployment)
    assert made_mig["device"] == result["device"]
    metadata = read_metadata(
        real_cluster, mig_pod, f"resourceclaims/{status['resourceClaimName']}/{mapping['requestName']}"
    )
    attributes = metadata["requests"][0]["devices"][0]["attributes"]
    assert attributes["uuid"] == {"string": made_mig["uuid"]}
    assert attributes["profile"] == {"string": "1g.10gb"}
    real_cluster.kubectl("delete", "-f", str(plugin_pod), "--wait=true", "--timeout=90s", timeout=120)
    wait_unprepared(fake_deployment)
    assert created_mig(fake_deployment) == []
    real_cluster.kubectl("delete", "-f", optional_classes, "--ignore-not-found")


#: A pod written for the device plugin's "mixed" MIG strategy, unchanged.
DEVICE_PLUGIN_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "mig-1g10gb", "namespace": "default"},
    "spec": {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "app",
                "image": "busybox:1.37",
                "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 3600 & wait'],
                "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
            }
        ],
    },
}


def published_attributes(cluster: RealCluster, device: str) -> dict[str, Any]:
    slices = cluster.get_json("resourceslices", "--field-selector", f"spec.driver={DRIVER}")
    for slice_ in slices["items"]:  # type: ignore[attr-defined]
        for published in slice_["spec"].get("devices") or []:
            if published["name"] == device:
                return published["attributes"]  # type: ignore[no-any-return]
    raise AssertionError(f"{device} is not published")


def read_metadata(cluster: RealCluster, pod: dict[str, Any], place: str) -> dict[str, Any]:
    """The first object (v1beta1) of the metadata file the pod's container reads at `place`."""
    path = f"/var/run/kubernetes.io/dra-device-attributes/{place}/{DRIVER}-metadata.json"
    meta = pod["metadata"]
    text = cluster.kubectl("-n", meta["namespace"], "exec", meta["name"], "--", "cat", path).stdout
    first, _ = json.JSONDecoder().raw_decode(text)
    assert first["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
    return first  # type: ignore[no-any-return]
