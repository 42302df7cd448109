"""Device telemetry on the real cluster: the `fake` DaemonSet reads the host's /proc, so a pod's
real container processes, named to the fake backend with `dradriver fake-event`, show in its
claim's series; a time-sliced claim shared by two pods is split per pod; an idle claim gets
`GPUIdle` Events on itself and its pod."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.plugin import DRIVER, NAMESPACE, REPO, Deployment, wait
from tests.e2e.realcluster import RealCluster
from tests.e2e.workloads import pods_of, wait_pods, wait_unprepared

pytestmark = pytest.mark.cluster

#: deploy/components/idle-events: what --idle-threshold needs to put Events on claims and pods.
IDLE_EVENTS_RBAC = REPO / "deploy/components/idle-events/rbac.yaml"
GIB = 1024**3
SLEEPER = {
    "image": "busybox:1.37",
    "command": ["sh", "-c", 'trap "exit 0" TERM; sleep 3600 & wait'],
    "resources": {"claims": [{"name": "gpu"}]},
}


def pod(name: str, claim: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": [{"name": "gpu", **claim}],
            "containers": [{"name": "app", **SLEEPER}],
        },
    }


def workloads() -> list[dict[str, Any]]:
    """A time-sliced claim shared by two pods, and a pod with a claim of its own that stays idle."""
    request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER}}
    sharing = {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Default"}},
    }
    shared = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "telemetry-shared"},
        "spec": {
            "devices": {
                "requests": [request],
                "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": sharing}}],
            }
        },
    }
    alone = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "telemetry-idle"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
    return [
        shared,
        alone,
        pod("telemetry-a", {"resourceClaimName": "telemetry-shared"}),
        pod("telemetry-b", {"resourceClaimName": "telemetry-shared"}),
        pod("telemetry-idle", {"resourceClaimTemplateName": "telemetry-idle"}),
    ]


def host_pids(pod_uid: str) -> list[int]:
    """The processes of a pod on this host, found as the telemetry finds their pod: by cgroup."""
    found = []
    needle = re.compile(f"pod{pod_uid}|pod{pod_uid.replace('-', '_')}")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle.search((entry / "cgroup").read_text()):
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)


def scrape(cluster: RealCluster, deployment: Deployment) -> dict[str, list[Any]]:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{deployment.pod()}:8080/proxy/metrics"
    text = cluster.kubectl("get", "--raw", path).stdout
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def one(samples: list[Any], **labels: str) -> Any:
    matching = [s for s in samples if labels.items() <= s.labels.items()]
    return matching[0] if len(matching) == 1 else None


def test_a_pods_load_shows_in_its_claims_series_split_per_pod_and_an_idle_claim_gets_events(
    real_cluster: RealCluster, fake_deployment: Deployment, request: pytest.FixtureRequest
) -> None:
    fake_deployment.set_env(
        DRADRIVER_TELEMETRY_INTERVAL="1", DRADRIVER_IDLE_THRESHOLD="5", DRADRIVER_IDLE_WINDOW="3"
    )
    documents = workloads()
    # Every device busy before a claim is prepared: only the idle claim's, once known, goes idle
    # (the shared claim's pods take longer than the idle window to start). The fake telemetry
    # outlives the deployment (the node's state directory): idle again after.
    devices = fake_deployment.devices()
    request.addfinalizer(lambda: fake_deployment.set_utilization(devices, 0))
    fake_deployment.set_utilization(devices, 70)
    real_cluster.kubectl("apply", "-f", str(IDLE_EVENTS_RBAC))  # Events in the tenants' namespaces
    real_cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(documents))
    try:
        running = wait_pods(
            real_cluster, documents, lambda p: p["status"].get("phase") == "Running", 120, "the pods Running"
        )
        uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in running}
        claim: Any = real_cluster.get_json("resourceclaim", "telemetry-shared")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        device = result["device"]
        pids = {name: wait(lambda n=name: host_pids(uids[n]), 30, f"{name}'s processes") for name in uids}
        fake_deployment.exec(
            "dradriver", "fake-event", "--device", device, "--utilization", "70",
            "--process", f"{pids['telemetry-a'][-1]}:6Gi:45",
            "--process", f"{pids['telemetry-b'][-1]}:2Gi:25",
        )  # fmt: skip

        def loaded() -> dict[str, list[Any]] | None:
            # The processes, not the utilisation the device had already; both pods once the
            # claim's reservations are known.
            found = scrape(real_cluster, fake_deployment)
            per_pod = found.get("dradriver_pod_gpu_sm_utilization_ratio", [])
            return found if len([s for s in per_pod if s.labels["device"] == device]) == 2 else None

        found = wait(loaded, 75, "the shared device's load split per pod in /metrics")
        series = one(found["dradriver_gpu_sm_utilization_ratio"], device=device)
        assert series.value == pytest.approx(0.7)
        assert series.labels["claim_name"] == "telemetry-shared"
        assert series.labels["claim_uid"] == claim["metadata"]["uid"]
        assert series.labels["sharing"] == "TimeSlicing(Default)"
        assert sorted(series.labels["pods"].split(",")) == ["default/telemetry-a", "default/telemetry-b"]
        per_pod = {
            s.labels["pod"]: s.value
            for s in found["dradriver_pod_gpu_sm_utilization_ratio"]
            if s.labels["device"] == device
        }
        assert per_pod == {"telemetry-a": pytest.approx(0.45), "telemetry-b": pytest.approx(0.25)}
        memory = {
            s.labels["pod"]: s.value
            for s in found["dradriver_pod_gpu_framebuffer_used_bytes"]
            if s.labels["device"] == device
        }
        assert memory == {"telemetry-a": 6 * GIB, "telemetry-b": 2 * GIB}

        (idle_pod,) = pods_of(real_cluster, [documents[-1]])
        (status,) = idle_pod["status"]["resourceClaimStatuses"]
        idle_claim = status["resourceClaimName"]
        idle_object: Any = real_cluster.get_json("resourceclaim", idle_claim)
        (idle_result,) = idle_object["status"]["allocation"]["devices"]["results"]
        fake_deployment.set_utilization([idle_result["device"]], 0)

        def idle_events() -> list[tuple[str, str]] | None:
            events: Any = real_cluster.get_json("events", "--field-selector", "reason=GPUIdle")["items"]
            kinds = sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events)
            wanted = [("Pod", "telemetry-idle"), ("ResourceClaim", idle_claim)]
            return kinds if all(w in kinds for w in wanted) else None

        kinds = wait(idle_events, 60, "GPUIdle Events on the idle claim and its pod")
        assert ("ResourceClaim", "telemetry-shared") not in kinds  # 70 % is not idle

        def idle_seconds() -> list[Any] | None:
            # The Events go out as a reading is taken, before /metrics serves it.
            idle = scrape(real_cluster, fake_deployment).get("dradriver_claim_idle_seconds", [])
            seconds = one(idle, claim_name=idle_claim)
            return idle if seconds is not None and seconds.value >= 3 else None

        idle = wait(idle_seconds, 30, "the idle claim's seconds in /metrics")
        assert one(idle, claim_name="telemetry-shared") is None

        top = fake_deployment.exec("dradriver", "top")
        lines = top.splitlines()
        assert all(len(line) <= 80 for line in lines)
        (row,) = [line for line in lines if line.startswith(f"{device} ")]
        assert row.split()[1] == "70%"
        assert "default/telemetry-shared" in row
    finally:
        real_cluster.kubectl("delete", "-f", "-", "--wait=true", stdin=yaml.safe_dump_all(documents))
        real_cluster.kubectl("delete", "-f", str(IDLE_EVENTS_RBAC))
        wait_unprepared(fake_deployment)
