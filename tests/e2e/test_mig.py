"""MIG on demand with the real scheduler: `serve --partitionable` on `a100-mig-empty` (GPU 0 in MIG
mode with no MIG devices, GPU 1 with MIG off), as the `fake` DaemonSet.

3g.40gb and 4g.40gb for two pods land on GPU 0 as two newly created MIG devices; a third MIG claim
that no longer fits stays Pending with the scheduler's reason; a whole-GPU claim gets GPU 1, never
the GPU in MIG mode; deleting the pods destroys the MIG devices. `dradriver dry-run --cluster`,
run before each step against the same API server, predicts each outcome.
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
