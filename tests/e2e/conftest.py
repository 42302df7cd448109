"""Fixtures of the end-to-end suite: the plugin image on the cluster and the deployments."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.plugin import REPO, Deployment
from tests.e2e.realcluster import RealCluster

#: An image archive from `make image`; built here when unset.
IMAGE_ENV = "DRADRIVER_E2E_IMAGE"


@pytest.fixture(scope="session")
def plugin_image(real_cluster: RealCluster) -> str:
    """The plugin's image, imported into the local cluster's containerd. On an existing cluster
    the nodes must have it already (e.g. `kind load image-archive build/image/...`)."""
    if real_cluster.local is None:
        return "dradriver (loaded by you)"
    archive = os.environ.get(IMAGE_ENV)
    if not archive:
        built = subprocess.run(
            [sys.executable, str(REPO / "scripts/build_image.py")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert built.returncode == 0, f"scripts/build_image.py failed:\n{built.stderr[-4000:]}"
        archive = built.stdout.strip().splitlines()[-1]
    real_cluster.local.import_image(Path(archive))
    return archive


@pytest.fixture(scope="module")
def fake_deployment(real_cluster: RealCluster, plugin_image: str) -> Iterator[Deployment]:
    """The `fake` overlay (fake dgx-h100 GPUs) as a DaemonSet, for one test module."""
    deployment = Deployment(real_cluster, "overlays/fake")
    deployment.install()
    try:
        yield deployment
    finally:
        deployment.uninstall()
