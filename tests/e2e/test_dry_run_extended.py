"""The claim kube-scheduler makes for a pod asking `nvidia.com/gpu` (DRAExtendedResource), beside the
one `dradriver dry-run --cluster` builds from the same manifest (`offline.extended`). The init
containers count first. A request's name counts the container's sorted requests, cpu too. A
sidecar gets its own request. A plain init container reuses the devices of the containers after
it, and asks only for what they lack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from tests.e2e.plugin import FAKE_OVERLAY_PROFILE, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import wait_unprepared

pytestmark = pytest.mark.cluster

GPU = "nvidia.com/gpu"
CLASS = "extended-resource.gpu.dradriver.dev"
#: The image the examples run (imported into the local cluster).
IMAGE = "busybox:1.37"


def manifest() -> dict[str, Any]:
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


def test_the_scheduler_s_claim_is_the_one_dry_run_builds(
    real_cluster: RealCluster, fake_deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_deployment.use_profile(FAKE_OVERLAY_PROFILE)  # no rollout: the modules before keep it
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(manifest()))
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
            ("container-0-request-0", CLASS, 1),
            ("container-1-request-0", CLASS, 1),
            ("container-2-request-2", CLASS, 1),
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
