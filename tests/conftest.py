"""Session-wide fixtures: the real cluster (when the environment names one) and its failure report."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.e2e.realcluster import RealCluster, gates_off_session, real_cluster_session

_MARKS = pytest.StashKey[dict[str, int]]()


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """A real Kubernetes cluster (started from DRADRIVER_E2E_BIN, or DRADRIVER_E2E_KUBECONFIG)."""
    with real_cluster_session(lambda: request.session.testsfailed > 0) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def gates_off_kubeconfig(real_cluster: RealCluster) -> Iterator[Path]:
    """A real API server with the DRA gates that strip slice fields turned off."""
    with gates_off_session(real_cluster) as kubeconfig:
        yield kubeconfig


@pytest.fixture(autouse=True)
def _cluster_log_marks(request: pytest.FixtureRequest) -> None:
    """Remember where the component logs stood when a test on the real cluster started."""
    if "real_cluster" in request.fixturenames:
        cluster: RealCluster = request.getfixturevalue("real_cluster")
        request.node.stash[_MARKS] = cluster.log_marks()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and call.when != "teardown" and _MARKS in item.stash:
        cluster = item.funcargs.get("real_cluster")  # type: ignore[attr-defined]
        if isinstance(cluster, RealCluster):
            for title, text in cluster.failure_sections(item.stash[_MARKS]):
                report.sections.append((title, text))
    return report
