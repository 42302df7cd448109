"""Every example of examples/claims/ on the profile its README row names, with the `fake` DaemonSet.

Each row's pods reach the phase the README predicts; inside every running container are exactly
the device nodes, and the env and mounts, that its claims' CDI specs promise; after deletion the
claims are unprepared, their CDI specs gone and the checkpoint empty.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from dradriver.slices import stored_differences
from tests.deploy.manifests import EXAMPLES, ExampleRow, example_table
from tests.e2e.plugin import Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import (
    check_container,
    check_log,
    events_for,
    load,
    pods_of,
    promised,
    promised_by_specs,
    unschedulable,
    wait_pods,
    wait_unprepared,
)

pytestmark = pytest.mark.cluster

#: The fake overlay's own profile first, then grouped by profile, so that few rows need a rollout.
ROWS = sorted(example_table(), key=lambda r: (r.profile != "dgx-h100", r.profile))


def expected_slices(profile: str, node: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dradriver",
            "slices",
            "--fake-gpus",
            profile,
            "--node-name",
            node,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    slices: list[dict[str, object]] = json.loads(done.stdout)
    return slices


def test_registers_and_publishes_what_dradriver_slices_renders(
    real_cluster: RealCluster, fake_deployment: Deployment
) -> None:
    fake_deployment.use_profile("dgx-h100")
    published = fake_deployment.slices()
    rendered = expected_slices("dgx-h100", real_cluster.node_name)
    assert len(published) == len(rendered)
    for stored, sent in zip(published, rendered, strict=True):
        assert stored["metadata"]["name"].startswith(sent["metadata"]["generateName"])  # type: ignore[index]
        assert stored_differences(sent, stored) == []
    assert "registered with the kubelet" in fake_deployment.all_logs()


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.file}@{r.profile}")
def test_example_runs_as_the_readme_says(
    real_cluster: RealCluster, fake_deployment: Deployment, row: ExampleRow
) -> None:
    fake_deployment.use_profile(row.profile)
    path = EXAMPLES / row.file
    documents = load(path)
    if row.pod != "Succeeded":
        real_cluster.kubectl("apply", "-f", str(path))
    # One outcome for every pod, or one per Pod of the file, in order ("Running, Pending").
    outcomes = row.pod.split(", ")
    named = [str(d["metadata"]["name"]) for d in documents if d["kind"] == "Pod"]
    per_pod = dict(zip(named, outcomes, strict=True)) if len(outcomes) > 1 else {}

    def outcome(pod: dict[str, Any]) -> str:
        return per_pod.get(str(pod["metadata"]["name"]), outcomes[0])

    def failed_prepares(pod: dict[str, Any]) -> list[str]:
        events = events_for(real_cluster, pod)
        return [e["message"] for e in events if e["reason"] == "FailedPrepareDynamicResources"]

    def settled(pod: dict[str, Any]) -> bool:
        expected = outcome(pod)
        if expected == "Pending":
            return unschedulable(pod)
        if expected == "prepare fails":
            return bool(failed_prepares(pod))
        return bool(pod["status"].get("phase") == expected)

    try:
        if row.pod == "Succeeded":  # a Job's pod finishes: its claim and spec are gone by then
            with fake_deployment.recording_cdi() as recorder:
                real_cluster.kubectl("apply", "-f", str(path))
                pods = wait_pods(real_cluster, documents, settled, 120, f"{row.file}: {row.pod}")
                specs = recorder.specs()
            assert len(specs) == 1, specs
            for pod in pods:
                for promise in promised_by_specs(pod, specs):
                    check_log(real_cluster, promise)
        else:
            pods = wait_pods(real_cluster, documents, settled, 120, f"{row.file}: {row.pod}")
        for pod in pods:
            if outcome(pod) == "Pending":
                message = next(
                    c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"
                )
                assert "cannot allocate all claims" in message, message
            elif outcome(pod) == "prepare fails":
                assert any("cannot be applied" in m for m in failed_prepares(pod)), failed_prepares(pod)
            elif outcome(pod) == "Running":
                for promise in promised(real_cluster, fake_deployment, pod):
                    check_container(real_cluster, promise)
        if {"Running", "Succeeded"} & set(outcomes):
            assert '"api": "v1"' in fake_deployment.all_logs(), "the kubelet did not use DRAPlugin v1"
    finally:
        real_cluster.kubectl(
            "delete", "-f", str(path), "--ignore-not-found", "--wait=true", "--timeout=90s", timeout=120
        )
    wait(lambda: not pods_of(real_cluster, documents), 60, f"{row.file}: pods gone")
    wait_unprepared(fake_deployment)
