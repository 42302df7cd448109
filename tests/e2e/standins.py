"""Local stand-ins for the images NVIDIA's specs run (tests/offline/migrate/fixtures): nothing can be
pulled on the test machines, so the local cluster gets, under each reference the specs name, the
host's static busybox (the layer of the examples' busybox image) plus what the specs' commands
call by name. They are stand-ins, not the images: no Ubuntu userland, no CUDA, no nvidia-smi.

- `ubuntu:*`, `nvidia/cuda:*` and the CUDA samples get `/bin/bash`, a script that runs busybox
  `sh` with the same arguments: the specs only use `bash -c` with POSIX shell (`trap`, `&`,
  `wait`, `sleep`, `echo`). `nvidia-smi`, `apt-get` and the samples' binaries are absent, so the
  commands that call them fail as on a node without a GPU (those rows are `needsGpu` in
  tests/offline/migrate/cases.yaml and are checked for allocation and container creation only).
- The CUDA samples' default command (the vectoradd spec runs it) says it is a stand-in and exits 1.
- `busybox:1.36` is the busybox layer alone, like the examples' `busybox:1.37`.

Every stand-in carries the label `dev.dradriver.e2e.stand-in` naming what it stands in for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scripts.build_image import ImageConfig
from tests.e2e.cluster import LocalCluster

LABEL = "dev.dradriver.e2e.stand-in"
BASH = '#!/bin/sh\n# dradriver e2e stand-in: bash is busybox sh, same arguments.\nexec /bin/sh "$@"\n'
UBUNTU_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NO_CUDA = ("sh", "-c", "echo 'dradriver e2e stand-in of a CUDA sample: no CUDA here' >&2; exit 1")


@dataclass(frozen=True)
class Standin:
    stands_in_for: str
    bash: bool
    cmd: tuple[str, ...]


#: By the image reference as the specs write it.
STANDINS = {
    "ubuntu:22.04": Standin("Ubuntu 22.04", True, ("bash",)),
    "ubuntu:24.04": Standin("Ubuntu 24.04", True, ("bash",)),
    "nvidia/cuda:12.5.0-devel-ubuntu22.04": Standin("CUDA 12.5 devel, Ubuntu 22.04", True, ("bash",)),
    "nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.6.0-ubuntu18.04": Standin("CUDA nbody", True, NO_CUDA),
    "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0": Standin("CUDA vectorAdd", True, NO_CUDA),
    "busybox:1.36": Standin("busybox 1.36", False, ("sh",)),
}


def normalized(reference: str) -> str:
    """The reference as containerd stores it (Docker Hub's defaults spelled out)."""
    first, slash, _ = reference.partition("/")
    if not slash:
        return f"docker.io/library/{reference}"
    if "." in first or ":" in first or first == "localhost":
        return reference
    return f"docker.io/{reference}"


def import_standins(cluster: LocalCluster, references: Iterable[str]) -> list[str]:
    """Import the stand-ins of `references` (each must be in STANDINS); returns their stored names."""
    wanted = sorted(set(references))
    unknown = [r for r in wanted if r not in STANDINS]
    assert not unknown, f"no local stand-in for {unknown}: add it to tests/e2e/standins.py"
    for with_bash in (True, False):
        images = {
            normalized(reference): ImageConfig(
                env=(UBUNTU_PATH,) if with_bash else ("PATH=/bin",),
                cmd=STANDINS[reference].cmd,
                labels={LABEL: STANDINS[reference].stands_in_for},
            )
            for reference in wanted
            if STANDINS[reference].bash == with_bash
        }
        if images:
            cluster.import_busybox_images(images, {"/bin/bash": BASH} if with_bash else None)
    return [normalized(r) for r in wanted]
