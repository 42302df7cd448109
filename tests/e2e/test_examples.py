"""Every example of examples/claims/ on the profile its README row names, with the `fake` DaemonSet.

Each row's pods reach the phase the README predicts; inside every running container are exactly
the device nodes, and the env and mounts, that its claims' CDI specs promise; after deletion the
claims are unprepared, their CDI specs gone and the checkpoint empty. Beside them, the claim the
real scheduler makes for a pod asking `nvidia.com/gpu` is the one `dradriver dry-run` builds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.slices import stored_differences
from tests.deploy.manifests import EXAMPLES, ExampleRow, example_table
from tests.e2e.plugin import FAKE_OVERLAY_PROFILE, Deployment, wait
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
#: What the extended-resource example asks for, and the class that serves it.
GPU = "nvidia.com/gpu"
EXTENDED_CLASS = "extended-resource.gpu.dradriver.dev"
#: The image the examples run (imported into the local cluster).
IMAGE = "busybox:1.37"


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


def extended_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "extended-init", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "setup", "image": IMAGE, "command": ["true"], "resources": {"limits": {GPU: 3}}},
                {
                    "name": "proxy",
                    "image": IMAGE,
                    "restartPolicy": "Always",
                    "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 3600 & wait'],
                    "resources": {"limits": {GPU: 1}},
                },
            ],
            "containers": [
                {
                    "name": "app",
                    "image": IMAGE,
                    "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 3600 & wait'],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {GPU: 1}},
                }
            ],
        },
    }


def test_the_scheduler_s_claim_for_extended_resources_is_the_one_dry_run_builds(
    real_cluster: RealCluster, fake_deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pod asking `nvidia.com/gpu` from a plain init container (3), a sidecar (1) and a
    container (1): the claim kube-scheduler makes for it (DRAExtendedResource) is the one `dradriver
    dry-run --cluster` builds (`offline.extended`). Init containers count first; a request's name
    counts the container's sorted requests, cpu too; the sidecar gets its own request; the init
    container reuses the devices of the containers after it and asks only for what they lack."""
    fake_deployment.use_profile(FAKE_OVERLAY_PROFILE)
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(extended_pod()))
    args = ["dry-run", "--claim", str(path), "--cluster", "--kubeconfig", str(real_cluster.kubeconfig)]
    assert main([*args, "-o", "json"]) == 0
    (ours,) = json.loads(capsys.readouterr().out)["nodes"][0]["claims"]
    real_cluster.kubectl("apply", "-f", str(path))
    try:

        def claimed() -> Any:
            pod = real_cluster.get_json("pod", "-n", "default", "extended-init")
            status: Any = pod.get("status") or {}
            return status.get("extendedResourceClaimStatus")

        status = wait(claimed, 120, "the scheduler's claim for the pod")
        theirs = real_cluster.get_json("resourceclaim", "-n", "default", status["resourceClaimName"])
        spec: Any = theirs["spec"]
        requests = [
            (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"])
            for r in spec["devices"]["requests"]
        ]
        assert requests == [(r["name"], r["deviceClassName"], r["count"]) for r in ours["requests"]]
        # setup (0) needs one GPU beyond those of proxy (1) and app (2), which start after it; the
        # app's GPU comes after its cpu and memory requests.
        assert requests == [
            ("container-0-request-0", EXTENDED_CLASS, 1),
            ("container-1-request-0", EXTENDED_CLASS, 1),
            ("container-2-request-2", EXTENDED_CLASS, 1),
        ]
        mappings = {(m["containerName"], m["requestName"]) for m in status["requestMappings"]}
        assert mappings == {
            ("setup", "container-0-request-0"),
            ("setup", "container-1-request-0"),
            ("setup", "container-2-request-2"),
            ("proxy", "container-1-request-0"),
            ("app", "container-2-request-2"),
        }
    finally:
        real_cluster.kubectl(
            "delete", "-f", str(path), "--ignore-not-found", "--wait=true", "--timeout=90s", timeout=120
        )
    wait_unprepared(fake_deployment)


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
