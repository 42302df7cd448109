"""Shares of one GPU with the real scheduler: `serve --gpu-shares mps` on one fake 80Gi GPU, as
the `fake` DaemonSet.

Four pods asking 20Gi each (examples/claims/gpu-share.yaml) all run on the GPU, each with its
own share; a fifth stays Pending with the scheduler's reason. Each container has its share's
CDI edits (its MPS client limits and the GPU's MPS pipe directory), and the GPU's one MPS
control daemon (the stand-in) has every client's limits. Deleting one pod lets the fifth start,
on the same daemon; deleting all stops the daemon and leaves nothing behind.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.backend.fake.mps_standin import STATE_FILE
from dradriver.prepare.gpu_share_daemons import SHARES_DIRECTORY
from dradriver.prepare.sharing_settings import MPS_PIPE_IN_CONTAINER
from dradriver.quantity import Quantity
from tests.deploy.manifests import EXAMPLES
from tests.e2e.plugin import DRIVER, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import (
    check_container,
    condition,
    load,
    pods_of,
    promised,
    unschedulable,
    wait_pods,
    wait_unprepared,
)

pytestmark = pytest.mark.cluster

HOST_DIR = Path("/var/lib/dradriver-e2e-shares")
STATE_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"
SHARE = {"memory": "20Gi", "computePercent": "25"}


@pytest.fixture(scope="module")
def shared_gpu(real_cluster: RealCluster, fake_deployment: Deployment) -> Iterator[Deployment]:
    """The plugin on one fake A100 80GB, published shareable."""
    real_cluster.require_local("it writes the plugin's profile file on the node")
    HOST_DIR.mkdir(parents=True, exist_ok=True)
    gpu = {
        "productName": "NVIDIA A100-SXM4-80GB",
        "count": 1,
        "architecture": "Ampere",
        "computeCapability": "8.0",
        "memoryMiB": 81920,
    }
    profile = {"driverVersion": "570.124.06", "cudaDriverVersion": "12.8", "gpus": [gpu]}
    (HOST_DIR / "gpus.yaml").write_text(yaml.safe_dump(profile))
    fake_deployment.profile_from_host(HOST_DIR)
    fake_deployment.set_env(DRADRIVER_GPU_SHARES="mps")

    def shareable() -> bool:
        devices = [d for s in fake_deployment.slices() for d in s["spec"].get("devices", [])]
        return [(d["name"], d.get("allowMultipleAllocations"), _memory(d)) for d in devices] == [
            ("gpu-0", True, 81920 * 2**20)
        ]

    # The whole 80Gi for the four shares: the profile's GPU, and no claim of an earlier test
    # still allocated on the pool's gpu-0 (the scheduler would count its share against it).
    wait(shareable, 60, "gpu-0 published shareable with the profile's 80Gi")
    wait(lambda: not _allocated_claims(real_cluster), 120, "no claim of an earlier test still on gpu-0")
    yield fake_deployment
    # Whatever the test reached: a share pod left behind would hold the node's GPU for the next tests.
    real_cluster.kubectl(
        "delete", "pod", *(f"gpu-share-{n}" for n in range(5)), "--ignore-not-found", "--wait=true",
        "--timeout=90s", timeout=120,
    )  # fmt: skip
    for name in os.listdir(HOST_DIR):
        (HOST_DIR / name).unlink()
    HOST_DIR.rmdir()


def _memory(device: dict[str, Any]) -> int | None:
    """The device's memory capacity in bytes (the API server writes 81920Mi as 80Gi)."""
    value = device.get("capacity", {}).get("memory", {}).get("value")
    return Quantity.parse(value).as_int64() if isinstance(value, str) else None


def _allocated_claims(cluster: RealCluster) -> list[str]:
    """The claims allocated a device named gpu-0 of our driver."""
    claims = cluster.get_json("resourceclaims", "--all-namespaces")["items"]
    assert isinstance(claims, list)
    return [
        f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        for c in claims
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        if r.get("driver") == DRIVER and r.get("device") == "gpu-0"
    ]


def _pods(count: int, start: int = 0) -> list[dict[str, Any]]:
    template, pod = load(EXAMPLES / "gpu-share.yaml")
    pods = []
    for n in range(start, start + count):
        named = copy.deepcopy(pod)
        named["metadata"]["name"] = f"gpu-share-{n}"
        pods.append(named)
    return ([template] if start == 0 else []) + pods


def _apply(cluster: RealCluster, documents: list[dict[str, Any]], path: Path) -> None:
    path.write_text(yaml.safe_dump_all(documents))
    cluster.kubectl("apply", "-f", str(path))


def _share(cluster: RealCluster, pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = cluster.get_json("resourceclaim", "-n", "default", status["resourceClaimName"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]  # type: ignore[index]
    assert isinstance(result, dict)
    return result


def _standin(cluster: RealCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """The MPS daemon's state as the container sees it in its pipe directory."""
    name = pod["metadata"]["name"]
    text = cluster.kubectl("exec", name, "--", "cat", f"{MPS_PIPE_IN_CONTAINER}/{STATE_FILE}").stdout
    state: dict[str, Any] = json.loads(text)
    return state


def _check_share(cluster: RealCluster, deployment: Deployment, pod: dict[str, Any]) -> str:
    result = _share(cluster, pod)
    assert result["device"] == "gpu-0"
    assert result["consumedCapacity"] == SHARE
    for promise in promised(cluster, deployment, pod):
        assert promise.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert promise.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
        assert MPS_PIPE_IN_CONTAINER in promise.mounts
        check_container(cluster, promise)
    log = cluster.kubectl("logs", pod["metadata"]["name"]).stdout.splitlines()
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in log
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in log
    share_id = result["shareID"]
    assert isinstance(share_id, str)
    return share_id


def test_four_20gi_shares_run_on_one_80gi_gpu_and_a_fifth_waits(
    real_cluster: RealCluster, shared_gpu: Deployment, tmp_path: Path
) -> None:
    four = _pods(4)
    _apply(real_cluster, four, tmp_path / "four.yaml")
    pods = wait_pods(
        real_cluster, four, lambda p: p["status"].get("phase") == "Running", 120, "four share pods Running"
    )
    share_ids = {_check_share(real_cluster, shared_gpu, pod) for pod in pods}
    assert len(share_ids) == 4
    # One daemon for the GPU, holding every client to its limits; every container sees it.
    states = [_standin(real_cluster, pod) for pod in pods]
    assert len({s["pid"] for s in states}) == 1
    clients = {sid: {"activeThreadPercentage": 25, "pinnedDeviceMemLimit": "20480M"} for sid in share_ids}
    assert states[0]["clients"] == clients
    assert len(states[0]["devices"]) == 1
    shown = [d for c in shared_gpu.status()["claims"] for d in c["devices"]]
    assert sorted(d["shareID"] for d in shown) == sorted(share_ids)
    assert all(d["share"] == {"memory": "20480Mi", "computePercent": 25, "enforcement": "mps"} for d in shown)

    fifth = _pods(1, start=4)
    _apply(real_cluster, fifth, tmp_path / "fifth.yaml")
    (pending,) = wait_pods(real_cluster, fifth, unschedulable, 60, "the fifth share pod held back")
    scheduled = condition(pending, "PodScheduled")
    assert scheduled is not None
    assert "cannot allocate all claims" in scheduled["message"]

    # One share released: the fifth pod gets it, on the same daemon.
    real_cluster.kubectl("delete", "pod", "gpu-share-0", "--wait=true", "--timeout=90s", timeout=120)
    (started,) = wait_pods(
        real_cluster, fifth, lambda p: p["status"].get("phase") == "Running", 120, "the fifth pod Running"
    )
    new_id = _check_share(real_cluster, shared_gpu, started)
    state = _standin(real_cluster, started)
    assert state["pid"] == states[0]["pid"]
    assert len(state["clients"]) == 4
    assert new_id in state["clients"]
    assert not share_ids & {new_id}

    # Every share released: the daemon stops, nothing is left on the node.
    everything = four + fifth
    real_cluster.kubectl(
        "delete",
        "-f",
        str(tmp_path / "four.yaml"),
        "-f",
        str(tmp_path / "fifth.yaml"),
        "--ignore-not-found",
        "--wait=true",
        "--timeout=90s",
        timeout=120,
    )
    wait(lambda: not pods_of(real_cluster, everything, terminating=True), 60, "the share pods to go")
    wait_unprepared(shared_gpu)
    wait(
        lambda: shared_gpu.exec("ls", "-A", f"{STATE_DIR}/{SHARES_DIRECTORY}/mps").split() == [],
        30,
        "the GPU's MPS daemon stopped and its directory removed",
    )
