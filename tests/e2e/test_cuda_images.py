"""CUDA in every image on the real cluster: the GPU DaemonSet (`deploy/base`) on the fake host
driver (tests/e2e/fakedriver.py), and pods from root filesystems built here, with no shell, each
running the CUDA probe (tests/fakenvml): it must load the host driver's libcuda.so.1 by SONAME,
see exactly the GPUs its claims were allocated (by UUID), and run nvidia-smi -L from PATH.

- a Debian slim root (mmdebstrap: Debian's libc6 and base-files, its own ld.so.cache, no
  LD_LIBRARY_PATH), read-only, one GPU;
- a lib64 root (the RHEL family's layout) whose ld.so.cache names a CUDA stub, two claims;
- a root whose LD_LIBRARY_PATH names its own directory, one GPU.

The roots are built once per session (mmdebstrap's part takes seconds: extract only, no dpkg run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.build_image import ImageConfig
from tests.e2e.fakedriver import UVM_NODES, FakeHostDriver, fake_host_driver
from tests.e2e.plugin import DRIVER, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import ClaimHistory, claim_history, wait_unprepared
from tests.fakenvml import cuda
from tests.fakenvml.cuda import ProbeRoot
from tests.release.release import ReleaseDirectory

pytestmark = pytest.mark.cluster

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
IMAGE = "docker.io/dradriver-e2e/cuda-{}:1"
NAMESPACE = "default"
#: root name -> (claims of its pod, read-only root filesystem)
PODS = {"debian-slim": (1, True), "lib64": (2, False), "own-ld-library-path": (1, False)}


def mmdebstrap_debian(dest: Path) -> Path:
    """Debian's libc6 and base-files, extracted (no maintainer scripts run, so no dpkg is needed)."""
    if shutil.which("mmdebstrap") is None:
        pytest.skip("needs mmdebstrap for the Debian slim root (apt-get install mmdebstrap)")
    command = ["mmdebstrap", "--variant=extract", "--include=libc6,base-files", "--quiet"]
    command += [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale")]
    subprocess.run(
        [*command, DEBIAN_SUITE, str(dest), DEBIAN_MIRROR],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return dest


@pytest.fixture(scope="module")
def probe_images(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeRoot]:
    """The probe roots, imported as images `cuda-<root name>`."""
    local = real_cluster.require_local("it imports images built here")
    work = tmp_path_factory.mktemp("cuda-images")
    build = cuda.build(work / "build")
    roots = cuda.probe_roots(work, build, debian_root=mmdebstrap_debian(work / "debian-slim"))
    chosen = {r.name: r for r in roots if r.name in PODS}
    for root in chosen.values():
        local.import_root(
            root.path, {IMAGE.format(root.name): ImageConfig(env=root.env, entrypoint=root.command)}
        )
    return chosen


@pytest.fixture(scope="module")
def gpu_node(
    real_cluster: RealCluster, release: ReleaseDirectory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Deployment, FakeHostDriver]]:
    real_cluster.require_local("it lays out a fake host driver on the node")
    with fake_host_driver(Path("/"), "dgx-h100", tmp_path_factory.mktemp("fake-driver")) as driver:
        deployment = Deployment(real_cluster, release, "base", env=driver.serve_env)
        deployment.install()
        try:
            yield deployment, driver
        finally:
            deployment.uninstall()


def manifests(name: str, claims: int, read_only: bool) -> list[dict[str, Any]]:
    """ResourceClaims (one GPU each) and the pod whose one container uses them all."""
    claim_names = [f"cuda-{name}-{i}" for i in range(claims)]
    documents: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        }
        for claim in claim_names
    ]
    container = {
        "name": "probe",
        "image": IMAGE.format(name),
        "imagePullPolicy": "Never",
        "securityContext": {"readOnlyRootFilesystem": read_only},
        "resources": {"claims": [{"name": c} for c in claim_names]},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"cuda-{name}", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claim_names],
            "containers": [container],
        },
    }
    return [*documents, pod]


def allocated(history: ClaimHistory, pod: dict[str, Any]) -> set[str]:
    """The devices of ours allocated to the claims reserved for the pod (from the watch: its
    claims are deallocated once it has finished)."""
    uid = pod["metadata"]["uid"]
    with history.lock:
        return {
            result["device"]
            for claim in history.versions
            if claim.get("status", {}).get("allocation")
            and any(r.get("uid") == uid for r in claim["status"].get("reservedFor", []))
            for result in claim["status"]["allocation"]["devices"]["results"]
            if result["driver"] == DRIVER
        }


def test_cuda_loads_and_sees_exactly_its_gpus_in_each_image(
    real_cluster: RealCluster,
    gpu_node: tuple[Deployment, FakeHostDriver],
    probe_images: dict[str, ProbeRoot],
    tmp_path: Path,
) -> None:
    deployment, driver = gpu_node
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
                devices = allocated(history, pod)
                assert len(devices) == PODS[name][0], (name, devices)
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
