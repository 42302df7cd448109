"""ResourceQuotas on the real cluster, with the release's optional DeviceClasses applied.

A namespace capped at 2 GPUs of gpu.dradriver.dev and 1 share of gpu-share.gpu.dradriver.dev:
`dradriver dry-run --cluster` reads that quota from the API server and says which claims it
admits; the API server then admits exactly those, refuses the third GPU claim and the second
share with the very message dry-run printed, and two pods run on the two GPU claims (the quota
controller then counts 2 GPUs used).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.kube import ApiError
from dradriver.offline.quota import devices_name
from tests.e2e.plugin import Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.offline.quota_admission import wait_for_admission
from tests.release.release import ReleaseDirectory

pytestmark = pytest.mark.cluster

NAMESPACE = "e2e-quota"
GPUS = devices_name("gpu.dradriver.dev")
SHARES = devices_name("gpu-share.gpu.dradriver.dev")


@pytest.fixture(scope="module")
def namespace(
    real_cluster: RealCluster, fake_deployment: Deployment, release: ReleaseDirectory
) -> Iterator[str]:
    quota_classes = str(release.optional_device_classes)
    real_cluster.kubectl("apply", "-f", quota_classes)
    real_cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        yield NAMESPACE
    finally:
        real_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", "--timeout=120s", timeout=150)
        real_cluster.kubectl("delete", "-f", quota_classes, "--ignore-not-found")


def claim(name: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
    }


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "app",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 3600 & wait'],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def test_the_api_server_refuses_what_dry_run_said_with_its_message(
    real_cluster: RealCluster, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = real_cluster.client()
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": namespace},
        "spec": {"hard": {GPUS: "2", SHARES: "1"}},
    }
    api.request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", body=quota)
    path = f"/api/v1/namespaces/{namespace}/resourcequotas/gpus"
    wait(lambda: set(api.request("GET", path).get("status", {}).get("used") or {}) == {GPUS, SHARES}, 60,
         "the quota controller to fill the quota's status")  # fmt: skip
    wait_for_admission(api, namespace)  # admission's own informer may lag the status

    claims = [claim(f"gpu-{n}", "gpu.dradriver.dev") for n in range(3)]
    claims += [claim(f"share-{n}", "gpu-share.gpu.dradriver.dev") for n in range(2)]
    claims_file = tmp_path / "claims.yaml"
    claims_file.write_text(yaml.safe_dump_all(claims))
    main(["dry-run", "--cluster", "--kubeconfig", str(real_cluster.kubeconfig), "--claim", str(claims_file),
          "-o", "json"])  # fmt: skip
    predicted = json.loads(capsys.readouterr().out)["quota"]["objects"]
    assert [o["admitted"] for o in predicted] == [True, True, False, True, False]

    answers: list[str | None] = []
    for body, ours in zip(claims, predicted, strict=True):
        try:
            api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", body=body)
            answers.append(None)
        except ApiError as err:
            if err.status != 403:
                raise
            answers.append(err.message)
        assert answers[-1] in ([None] if ours["admitted"] else [r["message"] for r in ours["refusals"]])
    assert answers[2] == (
        f'resourceclaims.resource.k8s.io "gpu-2" is forbidden: exceeded quota: gpus, '
        f"requested: {GPUS}=1, used: {GPUS}=2, limited: {GPUS}=2"
    )

    for n in range(2):
        api.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=pod(f"gpu-{n}", f"gpu-{n}"))

    def running() -> bool:
        pods = api.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        return [p.get("status", {}).get("phase") for p in pods] == ["Running", "Running"]

    wait(running, 120, "both pods to run on their GPU claims")
    used = api.request("GET", path)["status"]["used"]
    assert (used[GPUS], used[SHARES]) == ("2", "1")
