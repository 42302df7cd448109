"""The real cluster the `cluster`-marked and end-to-end tests run against.

Either started here from a directory of Kubernetes binaries (DRADRIVER_E2E_BIN) or an existing
one (DRADRIVER_E2E_KUBECONFIG: kind, a GPU cluster, ...). Without either, those tests skip with
one line saying so. A second API server with the DRA gates that strip slice fields turned off
(for the dropped-field tests) is started beside a local cluster, or named by
DRADRIVER_E2E_KUBECONFIG_GATES_OFF.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dradriver.kube import KubeClient, load_client
from tests.e2e.cluster import ControlPlane, LocalCluster, missing_binaries, node_ip
from tests.e2e.processes import tail

BIN_ENV = "DRADRIVER_E2E_BIN"
KUBECONFIG_ENV = "DRADRIVER_E2E_KUBECONFIG"
NODE_ENV = "DRADRIVER_E2E_NODE"
GATES_OFF_ENV = "DRADRIVER_E2E_KUBECONFIG_GATES_OFF"
#: Where the local cluster keeps its state and logs (default: a new directory under /var/tmp).
WORK_ENV = "DRADRIVER_E2E_WORKDIR"
#: Feature gates of every component of the local cluster. ResourceHealthStatus (alpha in 1.36)
#: puts device health into the pod status (KEP-4680), which the health scenario checks.
GATES_ENV = "DRADRIVER_E2E_FEATURE_GATES"
DEFAULT_GATES = "ResourceHealthStatus=true"
SKIP_REASON = (
    f"needs a real Kubernetes cluster: set {BIN_ENV} (a directory with the Kubernetes 1.36 binaries; "
    f"`make e2e` unpacks ../shared/k8s) or {KUBECONFIG_ENV}"
)
GATES_OFF = "DRADeviceTaints=false,DRAPartitionableDevices=false"
#: Kubelet lines worth quoting when a test fails: its DRA manager and plugin registration.
KUBELET_DRA_LINES = re.compile(r"(?i)\bdra\b|resourceclaim|plugin|cdi|prepare", re.IGNORECASE)


@dataclass
class RealCluster:
    kubeconfig: Path
    node_name: str
    local: LocalCluster | None = None
    #: Extra logs to quote on a failure (the plugin's), by name.
    log_sources: dict[str, Callable[[], str]] = field(default_factory=dict)

    def kubectl(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        from tests.deploy.manifests import kubectl

        done = subprocess.run(
            [kubectl(), "--kubeconfig", str(self.kubeconfig), "--request-timeout=30s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def get_json(self, *args: str) -> dict[str, object]:
        result: dict[str, object] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return result

    def client(self) -> KubeClient:
        client = load_client(str(self.kubeconfig))
        assert client is not None
        return client

    def require_local(self, why: str) -> LocalCluster:
        if self.local is None:
            pytest.skip(f"needs the local cluster ({BIN_ENV}): {why}")
        return self.local

    # --- what to show when a test fails --------------------------------------------------------

    def log_marks(self) -> dict[str, int]:
        if self.local is None:
            return {}
        return {name: path.stat().st_size for name, path in self.local.component_logs().items()}

    def failure_sections(self, marks: dict[str, int]) -> list[tuple[str, str]]:
        """The log lines written since `marks`: every component's tail, the kubelet's DRA lines."""
        sections = []
        if self.local is not None:
            for name, path in self.local.component_logs().items():
                start = marks.get(name, 0)
                if name == "kubelet":
                    lines = [
                        line
                        for line in tail(path, 100000, start).splitlines()
                        if KUBELET_DRA_LINES.search(line)
                    ]
                    text = "\n".join(lines[-60:])
                else:
                    text = tail(path, 25, start)
                if text:
                    sections.append((f"{name} log since the test started ({path})", text))
        for name, source in self.log_sources.items():
            try:
                text = source()
            except Exception as err:  # a failure report must not fail itself
                text = f"(could not read: {err})"
            sections.append((f"{name} log", text))
        return sections


def _first_ready_node(kubeconfig: Path) -> str:
    from tests.deploy.manifests import kubectl

    nodes = json.loads(
        subprocess.run(
            [kubectl(), "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )["items"]
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
        if conditions.get("Ready") == "True" and not node["spec"].get("unschedulable"):
            return str(node["metadata"]["name"])
    pytest.fail(f"{KUBECONFIG_ENV}: the cluster has no Ready, schedulable node (set {NODE_ENV})")


def _work_dir() -> tuple[Path, bool]:
    """The local cluster's directory, and whether it is ours to remove (not named by WORK_ENV)."""
    if configured := os.environ.get(WORK_ENV):
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        return path, False
    return Path(tempfile.mkdtemp(prefix="dradriver-e2e-", dir="/var/tmp")), True


@contextmanager
def real_cluster_session(failed: Callable[[], bool]) -> Iterator[RealCluster]:
    """The session's cluster. A local cluster's directory (its logs) is removed after a session
    in which nothing `failed`, and kept, saying where, otherwise."""
    if kubeconfig := os.environ.get(KUBECONFIG_ENV):
        path = Path(kubeconfig)
        yield RealCluster(path, os.environ.get(NODE_ENV) or _first_ready_node(path))
        return
    bin_dir = os.environ.get(BIN_ENV)
    if not bin_dir:
        pytest.skip(SKIP_REASON)
    if missing := missing_binaries(Path(bin_dir)):
        pytest.fail(f"{BIN_ENV}={bin_dir} lacks {', '.join(missing)}")
    work_dir, ours = _work_dir()
    local = LocalCluster(Path(bin_dir), work_dir, feature_gates=os.environ.get(GATES_ENV, DEFAULT_GATES))
    passed = False
    try:
        local.start()
        yield RealCluster(local.kubeconfig, local.node_name, local)
        passed = not failed()
    finally:
        local.stop()
        if ours and passed:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            print(f"\nthe local cluster's logs are kept in {local.logs}")


@contextmanager
def gates_off_session(cluster: RealCluster) -> Iterator[Path]:
    """A kubeconfig for an API server with DRADeviceTaints and DRAPartitionableDevices off."""
    if configured := os.environ.get(GATES_OFF_ENV):
        yield Path(configured)
        return
    if cluster.local is None:
        pytest.skip(f"needs an API server with {GATES_OFF}: set {GATES_OFF_ENV} or use {BIN_ENV}")
    control_plane = ControlPlane(
        cluster.local.bin_dir, cluster.local.work_dir / "gates-off", node_ip(), feature_gates=GATES_OFF
    )
    try:
        control_plane.start()
        yield control_plane.admin_kubeconfig
    finally:
        control_plane.stop()
