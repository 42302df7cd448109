"""Fixtures of the end-to-end suite: the plugin image on the cluster and the deployments."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.build_image import version
from tests.e2e.plugin import REPO, Deployment
from tests.e2e.realcluster import RealCluster
from tests.release.release import RELEASE_ENV, ReleaseDirectory, build_release


@pytest.fixture(scope="session")
def release(real_cluster: RealCluster) -> ReleaseDirectory:
    """The release the suite deploys: $DRADRIVER_RELEASE (`make e2e` and CI build it first), else
    one built here from this checkout. Its image is imported into the local cluster's containerd;
    on an existing cluster the nodes must have it already (`kind load image-archive ...`)."""
    given = os.environ.get(RELEASE_ENV)
    if given:
        directory = ReleaseDirectory.read(Path(given))
    else:
        directory = build_release(REPO, version(), REPO / "build/e2e" / f"dradriver-{version()}")
    if real_cluster.local is not None:
        real_cluster.local.import_image(directory.archive)
    return directory


@pytest.fixture(scope="module")
def fake_deployment(real_cluster: RealCluster, release: ReleaseDirectory) -> Iterator[Deployment]:
    """The `fake` overlay (fake dgx-h100 GPUs) as a DaemonSet, for one test module."""
    deployment = Deployment(real_cluster, release, "overlays/fake")
    deployment.install()
    try:
        yield deployment
    finally:
        deployment.uninstall()
