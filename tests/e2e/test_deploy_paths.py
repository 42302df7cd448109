"""The GPU DaemonSets (`deploy/base`, `deploy/overlays/gpu-operator`) on a fake host driver.

The fake driver (tests/e2e/fakedriver.py) is laid out at the kustomization's driver root on the
node: serve in the privileged pod loads the C fake libnvidia-ml from there through the real NVML
code path, publishes what `dradriver slices` renders from the same driver root on the host, and
prepares claims whose CDI specs mount the host driver's files into the containers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dradriver.slices import stored_differences
from tests.deploy.manifests import EXAMPLES
from tests.e2e.fakedriver import NVIDIA_SMI_LOG, FakeHostDriver, fake_host_driver
from tests.e2e.plugin import Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import check_container, load, pods_of, promised, wait_pods, wait_unprepared
from tests.release.release import ReleaseDirectory

pytestmark = pytest.mark.cluster

#: kustomization -> the host driver root its DaemonSet mounts.
DRIVER_ROOTS = {"base": Path("/"), "overlays/gpu-operator": Path("/run/nvidia/driver")}


@pytest.fixture(params=sorted(DRIVER_ROOTS), ids=lambda k: k.rsplit("/", 1)[-1])
def gpu_deployment(
    request: pytest.FixtureRequest, real_cluster: RealCluster, release: ReleaseDirectory, tmp_path: Path
) -> Iterator[tuple[Deployment, FakeHostDriver]]:
    real_cluster.require_local("it lays out a fake host driver on the node")
    kustomization: str = request.param
    with fake_host_driver(DRIVER_ROOTS[kustomization], "dgx-h100", tmp_path) as driver:
        deployment = Deployment(real_cluster, release, kustomization, env=driver.serve_env)
        deployment.install()
        try:
            yield deployment, driver
        finally:
            deployment.uninstall()


def run_example(cluster: RealCluster, deployment: Deployment, name: str) -> None:
    path = EXAMPLES / name
    documents = load(path)
    cluster.kubectl("apply", "-f", str(path))
    try:
        pods = wait_pods(
            cluster, documents, lambda p: p["status"].get("phase") == "Running", 120, f"{name} Running"
        )
        for pod in pods:
            promises = promised(cluster, deployment, pod)
            assert promises
            for promise in promises:
                assert "/usr/local/nvidia/lib64/libcuda.so.1" in promise.mounts
                assert "/usr/local/nvidia/bin/nvidia-smi" in promise.mounts
                check_container(cluster, promise)
    finally:
        cluster.kubectl("delete", "-f", str(path), "--wait=true", "--timeout=90s", timeout=120)
    wait(lambda: not pods_of(cluster, documents), 60, f"{name}: pods gone")
    wait_unprepared(deployment)


def test_gpu_daemonset_runs_the_real_nvml_path(
    real_cluster: RealCluster, gpu_deployment: tuple[Deployment, FakeHostDriver]
) -> None:
    deployment, driver = gpu_deployment
    rendered = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dradriver",
                "slices",
                "--driver-root",
                str(driver.root),
                "--node-name",
                real_cluster.node_name,
                "-o",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    published = deployment.slices()
    assert len(published) == len(rendered) == 1
    assert stored_differences(rendered[0], published[0]) == []
    assert deployment.devices() == [f"gpu-{g.minor}" for g in driver.inventory.gpus]
    assert '"source": "nvml"' in deployment.all_logs()

    run_example(real_cluster, deployment, "single-gpu.yaml")
    # Time-slicing runs the host driver's nvidia-smi from the driver root inside the pod.
    run_example(real_cluster, deployment, "time-slicing.yaml")
    calls = deployment.exec("cat", NVIDIA_SMI_LOG).splitlines()
    assert any("--set-timeslice=3" in call for call in calls), calls
    assert any("--set-timeslice=0" in call for call in calls), calls
