"""The GPU DaemonSets (`deploy/base`, `deploy/overlays/gpu-operator`) on a fake host driver.

The fake driver (tests/e2e/fakedriver.py) is laid out at the kustomization's driver root on the
node: serve in the privileged pod loads the C fake libnvidia-ml from there through the real NVML
code path, publishes what `dradriver slices` renders from the same driver root on the host, and
prepares claims whose CDI specs mount the host driver's files into the containers, where CUDA
programs in images of every layout load them (tests/e2e/cudaimages.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.slices import stored_differences
from tests.deploy.manifests import EXAMPLES, kubectl
from tests.e2e.cudaimages import NAMESPACE, PODS, allocated, import_probe_images, manifests
from tests.e2e.fakedriver import NVIDIA_SMI_LOG, UVM_NODES, FakeHostDriver, fake_host_driver
from tests.e2e.plugin import CDI_DIR, DRIVER, GPU_CLIENT_LABEL, STATE_DIR, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import (
    check_container,
    claim_history,
    claim_names,
    load,
    pods_of,
    promised,
    wait_pods,
    wait_unprepared,
)
from tests.fakenvml import cuda
from tests.fakenvml.cuda import ProbeRoot
from tests.release.release import ReleaseDirectory

pytestmark = pytest.mark.cluster

#: kustomization -> the host driver root its DaemonSet mounts.
DRIVER_ROOTS = {"base": Path("/"), "overlays/gpu-operator": Path("/run/nvidia/driver")}


@pytest.fixture(scope="module", params=sorted(DRIVER_ROOTS), ids=lambda k: k.rsplit("/", 1)[-1])
def gpu_deployment(
    request: pytest.FixtureRequest,
    real_cluster: RealCluster,
    release: ReleaseDirectory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Deployment, FakeHostDriver]]:
    """One install per driver root, for every test of the module."""
    real_cluster.require_local("it lays out a fake host driver on the node")
    kustomization: str = request.param
    with fake_host_driver(
        DRIVER_ROOTS[kustomization], "dgx-h100", tmp_path_factory.mktemp("driver")
    ) as driver:
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


@pytest.fixture(scope="module")
def probe_images(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeRoot]:
    local = real_cluster.require_local("it imports images built here")
    return import_probe_images(local, tmp_path_factory.mktemp("cuda-images"))


def test_cuda_loads_and_sees_exactly_its_gpus_in_each_image(
    real_cluster: RealCluster,
    gpu_deployment: tuple[Deployment, FakeHostDriver],
    probe_images: dict[str, ProbeRoot],
    tmp_path: Path,
) -> None:
    """Whichever the driver root, every root's probe (see tests/e2e/cudaimages.py)."""
    deployment, driver = gpu_deployment
    gpus = {f"gpu-{g.minor}": g for g in driver.inventory.gpus}
    documents = [d for name, (claims, ro) in PODS.items() for d in manifests(name, claims, ro)]
    path = tmp_path / "cuda-pods.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))

    def finished() -> dict[str, dict[str, Any]] | None:
        pods = {name: real_cluster.get_json("pod", "-n", NAMESPACE, f"cuda-{name}") for name in PODS}
        phases = {name: pod["status"].get("phase") for name, pod in pods.items()}  # type: ignore[attr-defined]
        return pods if set(phases.values()) <= {"Succeeded", "Failed"} else None

    seen: dict[str, cuda.Probed] = {}
    with claim_history(real_cluster) as history:
        real_cluster.kubectl("apply", "-f", str(path))
        try:
            pods = wait(finished, 180, "the probe pods to finish")
            for name, pod in pods.items():
                log = real_cluster.kubectl("-n", NAMESPACE, "logs", f"cuda-{name}").stdout
                seen[name] = probed = cuda.parse_probe(log)
                assert pod["status"]["phase"] == "Succeeded", f"{name}: {log}"
                assert probed.ok, f"{name}: {log}"
                # The history is a watch's, read on its own thread.
                devices = wait(
                    lambda pod=pod, name=name: (
                        found if len(found := allocated(history, pod)) == PODS[name][0] else None
                    ),
                    30,
                    f"{name}'s {PODS[name][0]} allocated device(s) in the claim history",
                )
                uuids = {gpus[d].uuid for d in devices}
                assert set(probed.devices) == {cuda.bare_uuid(u) for u in uuids}, (name, log)
                assert {line.rsplit("UUID: ", 1)[1].rstrip(")") for line in probed.nvidia_smi} == uuids, log
                env = probe_images[name].env
                own = next((e.partition("=")[2] for e in env if e.startswith("LD_LIBRARY_PATH=")), "-")
                assert probed.ld_library_path == own, name  # the image's own, never replaced
        finally:
            real_cluster.kubectl("delete", "-f", str(path), "--wait=true", "--timeout=90s", timeout=120)
    assert seen["lib64"].libcuda == "/usr/lib64/libcuda.so.1"  # over the image's CUDA stub
    assert seen["own-ld-library-path"].needed == {cuda.HELPER_SONAME: f"/opt/app/lib/{cuda.HELPER_SONAME}"}
    wait_unprepared(deployment)
    # Missing on this node (no UVM module), the plugin made them as the host driver's /proc says.
    for node, minor in zip(UVM_NODES, (0, 1), strict=True):
        rdev = node.stat().st_rdev
        assert node.is_char_device(), node
        assert (os.major(rdev), os.minor(rdev)) == (driver.inventory.nvidia_uvm_major, minor), node


def _terminated_on_deletion(watch_log: Path) -> dict[str, Any] | None:
    """The plugin container's terminated state in the pod's DELETED watch event, once kubectl
    wrote it."""
    decoder, text, position = json.JSONDecoder(), watch_log.read_text(), 0
    while (start := text.find("{", position)) != -1:
        event, position = decoder.raw_decode(text, start)
        if event["type"] == "DELETED":
            (status,) = event["object"]["status"]["containerStatuses"]
            terminated: dict[str, Any] = status["state"]["terminated"]
            return terminated
    return None


def test_the_gpu_operator_takes_the_plugin_off_for_a_driver_upgrade_and_back(
    real_cluster: RealCluster, gpu_deployment: tuple[Deployment, FakeHostDriver], tmp_path: Path
) -> None:
    """The GPU operator's driver manager sets nvidia.com/gpu.deploy.client to
    paused-for-driver-upgrade before it unloads the host driver, waits until the DaemonSet pods
    whose nodeSelector names the label are gone, and sets it back to "true" after. A running
    pod's claim stays prepared meanwhile and is served again (unprepared at its deletion)."""
    deployment, _driver = gpu_deployment
    if deployment.kustomization != "overlays/gpu-operator":
        pytest.skip("only the gpu-operator layout takes part in the GPU operator's driver upgrades")
    node = real_cluster.node_name
    plugin = deployment.pods()[0]
    # What the driver manager's wait looks for: a DaemonSet's pod with the key in its nodeSelector.
    assert plugin["metadata"]["ownerReferences"][0]["kind"] == "DaemonSet"
    assert plugin["spec"]["nodeSelector"] == {GPU_CLIENT_LABEL: "true"}
    path = EXAMPLES / "single-gpu.yaml"
    documents = load(path)
    real_cluster.kubectl("apply", "-f", str(path))
    try:
        (pod,) = wait_pods(
            real_cluster,
            documents,
            lambda p: p["status"].get("phase") == "Running",
            120,
            "single-gpu Running",
        )
        (claim_name,) = claim_names(pod).values()
        uid = real_cluster.get_json("resourceclaim", "-n", "default", claim_name)["metadata"]["uid"]  # type: ignore[index]
        cdi_spec = Path(CDI_DIR) / f"k8s.{DRIVER}-claim_{uid}.json"
        spec_before = cdi_spec.read_text()
        watch_log = tmp_path / "plugin-watch.json"
        with watch_log.open("w") as out:
            watcher = subprocess.Popen(
                [kubectl(), "--kubeconfig", str(real_cluster.kubeconfig), "-n", "dradriver", "get", "pod",
                 plugin["metadata"]["name"], "-w", "-o", "json", "--output-watch-events"],
                stdout=out, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            wait(lambda: '"ADDED"' in watch_log.read_text(), 30, "the watch on the plugin pod")
            real_cluster.kubectl(
                "label", "node", node, f"{GPU_CLIENT_LABEL}=paused-for-driver-upgrade", "--overwrite"
            )
            terminated = wait(lambda: _terminated_on_deletion(watch_log), 90, "the plugin pod deleted")
        finally:
            watcher.terminate()
            watcher.wait(10)
        # serve stopped on SIGTERM, NVML shut down, within the grace period.
        assert terminated["exitCode"] == 0, terminated
        daemonset = real_cluster.get_json("daemonset", "-n", "dradriver", "dradriver-kubelet-plugin")
        assert daemonset["status"]["desiredNumberScheduled"] == 0  # type: ignore[index]
        # While it is away: the workload runs on, its claim prepared on the node.
        assert real_cluster.get_json("pod", "single-gpu")["status"]["phase"] == "Running"  # type: ignore[index]
        assert cdi_spec.read_text() == spec_before
        assert uid in (Path(STATE_DIR) / "checkpoint.json").read_text()
        real_cluster.kubectl("label", "node", node, f"{GPU_CLIENT_LABEL}=true", "--overwrite")
        deployment.wait_ready()
        assert uid in {c["uid"] for c in deployment.status()["claims"]}
        assert deployment.cdi_spec(uid) == json.loads(spec_before)
    finally:
        real_cluster.kubectl("label", "node", node, f"{GPU_CLIENT_LABEL}=true", "--overwrite")
        real_cluster.kubectl("delete", "-f", str(path), "--wait=true", "--timeout=90s", timeout=120)
    wait(lambda: not pods_of(real_cluster, documents), 60, "single-gpu: pods gone")
    wait_unprepared(deployment)
