"""CUDA in every image on the real cluster: root filesystems built here, with no shell, each
running the CUDA probe (tests/fakenvml) in a pod whose claims the GPU DaemonSet prepares; it must
load the host driver's libcuda.so.1 by SONAME, see exactly the GPUs its claims were allocated (by
UUID), and run nvidia-smi -L from PATH.

- a Debian slim root (mmdebstrap: Debian's libc6 and base-files, its own ld.so.cache, no
  LD_LIBRARY_PATH), read-only, one GPU;
- a lib64 root (the RHEL family's layout) whose ld.so.cache names a CUDA stub, two claims;
- a root whose LD_LIBRARY_PATH names its own directory, one GPU.

The roots are built once per module (mmdebstrap's part takes seconds: extract only, no dpkg run).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from scripts.build_image import ImageConfig
from tests.e2e.cluster import LocalCluster
from tests.e2e.plugin import DRIVER
from tests.e2e.workloads import ClaimHistory
from tests.fakenvml import cuda
from tests.fakenvml.cuda import ProbeRoot

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


def import_probe_images(local: LocalCluster, work: Path) -> dict[str, ProbeRoot]:
    """The probe roots of PODS, imported as images `cuda-<root name>`."""
    build = cuda.build(work / "build")
    roots = cuda.probe_roots(work, build, debian_root=mmdebstrap_debian(work / "debian-slim"))
    chosen = {r.name: r for r in roots if r.name in PODS}
    for root in chosen.values():
        local.import_root(
            root.path, {IMAGE.format(root.name): ImageConfig(env=root.env, entrypoint=root.command)}
        )
    return chosen


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
