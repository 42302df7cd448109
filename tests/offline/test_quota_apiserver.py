"""Our ResourceQuota counting against the real API server's, on generated quotas and claims.

A real kube-apiserver (ResourceQuota admission) and kube-controller-manager from
DRADRIVER_E2E_BIN, nothing else: no scheduler, no kubelet, no machine lock. Its quota controller
fills each quota's status (which admission needs); its deployment, replicaset and resourceclaim
controllers turn a Deployment into pods and their pods' templates into claims. Each generated
case gets a namespace and one or two quotas over the entries a claim counts against; then either
a sequence of claims, each created for real and the API server's answer (created, or refused with
its message) compared with `QuotaLedger.admit`, or a Deployment whose pods' claims are compared
with what `admissions` and `check` say of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.kube import ApiError, KubeClient, load_client
from dradriver.offline.allocation.model import parse_claim
from dradriver.offline.extended import pod_extended_resources
from dradriver.offline.quota import (
    CLAIM_COUNT,
    IMPLICIT_PREFIX,
    QuotaLedger,
    admissions,
    check,
    claim_usage,
    devices_name,
    parse_resource_quota,
)
from tests.deploy.manifests import REPO, load_documents
from tests.e2e.cluster import ControlPlane, missing_binaries, node_ip
from tests.e2e.processes import Component, free_port, wait_until
from tests.e2e.realcluster import BIN_ENV
from tests.offline.migrate.test_quota import DEVICE_PLUGIN_QUOTA
from tests.offline.quota_admission import refusal, wait_for_admission

pytestmark = pytest.mark.cluster

SEED = 39
CASES = 100
#: Classes the generated claims use; the last maps an extended resource (DRAExtendedResource).
CLASSES = ("qa.example.com", "qb.example.com", "qx.example.com")
EXTENDED = {"qx.example.com": "example.com/gpu"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeClient]:
    bin_dir = os.environ.get(BIN_ENV)
    if not bin_dir or missing_binaries(Path(bin_dir)):
        pytest.skip(f"needs kube-apiserver and kube-controller-manager: set {BIN_ENV}")
    work = tmp_path_factory.mktemp("quota-apiserver")
    plane = ControlPlane(Path(bin_dir), work, node_ip(), beta_resource_apis=False)
    try:
        plane.start()
        manager = Component(
            "kube-controller-manager",
            [
                str(Path(bin_dir) / "kube-controller-manager"),
                f"--kubeconfig={plane.admin_kubeconfig}",
                "--controllers=resourcequota,deployment-controller,replicaset-controller,"
                "resourceclaim-controller",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ],
            plane.logs / "kube-controller-manager.log",
        )
        manager.start()
        plane.components.append(manager)
        client = load_client(str(plane.admin_kubeconfig))
        assert client is not None
        for name in CLASSES:
            spec: dict[str, Any] = {"selectors": [{"cel": {"expression": "true"}}]}
            if name in EXTENDED:
                spec["extendedResourceName"] = EXTENDED[name]
            client.request(
                "POST",
                "/apis/resource.k8s.io/v1/deviceclasses",
                body={"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                      "spec": spec},
            )  # fmt: skip
        yield client
        client.close()
    finally:
        plane.stop()


# -- generated cases ---------------------------------------------------------------------------------


def _subrequest(rng: random.Random, name: str) -> dict[str, Any]:
    sub: dict[str, Any] = {"deviceClassName": rng.choice(CLASSES)}
    if rng.random() < 0.15:
        sub["allocationMode"] = "All"
    else:
        sub["count"] = rng.randint(1, 3)
    return {"name": name, **sub} if name else sub


def _claim(rng: random.Random, name: str) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            alternatives = [_subrequest(rng, f"alt{j}") for j in range(rng.randint(2, 3))]
            requests.append({"name": f"r{i}", "firstAvailable": alternatives})
        else:
            requests.append({"name": f"r{i}", "exactly": _subrequest(rng, "")})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests}},
    }


def _hard(rng: random.Random) -> dict[str, str]:
    entries = [devices_name(c) for c in CLASSES] + [IMPLICIT_PREFIX + c for c in CLASSES]
    entries += [CLAIM_COUNT, "requests.example.com/gpu"]
    chosen = rng.sample(entries, rng.randint(1, 4))
    return {entry: rng.choice(["0", "1", "2", "3", "4", "6", "32", "40", "1k"]) for entry in chosen}


def _case(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    quotas: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": f"quota-{i}"},
         "spec": {"hard": _hard(rng)}}
        for i in range(rng.choice([1, 1, 2]))
    ]  # fmt: skip
    claims = [_claim(rng, f"claim-{i}") for i in range(rng.randint(2, 5))]
    return quotas, claims


def _ready_quotas(api: KubeClient, namespace: str, count: int) -> list[dict[str, Any]]:
    """The namespace's quotas once the quota controller has written their status."""
    found: list[dict[str, Any]] = []

    def ready() -> bool:
        nonlocal found
        found = api.request("GET", f"/api/v1/namespaces/{namespace}/resourcequotas").get("items", [])
        return len(found) == count and all(
            set((q.get("status") or {}).get("used") or {}) >= set(q["spec"]["hard"]) for q in found
        )

    wait_until(ready, 60, f"the quota controller to fill the quotas of {namespace}")
    return [{**q, "kind": "ResourceQuota"} for q in found]


def _namespace(api: KubeClient, name: str, quotas: list[dict[str, Any]]) -> QuotaLedger:
    """A namespace with the quotas (and the default ServiceAccount pods need), once their status
    is there; the ledger of those quotas as the API server has them."""
    api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": name}})  # fmt: skip
    api.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts", body={"apiVersion": "v1",
                "kind": "ServiceAccount", "metadata": {"name": "default"}})  # fmt: skip
    for quota in quotas:
        api.request("POST", f"/api/v1/namespaces/{name}/resourcequotas", body=quota)
    ready = _ready_quotas(api, name, len(quotas))
    wait_for_admission(api, name)
    return QuotaLedger([parse_resource_quota(q) for q in ready], EXTENDED)


def _agrees(ours: set[str], theirs: str | None) -> bool:
    """Both admit, or the API server's refusal is one of ours."""
    return not ours if theirs is None else theirs in ours


def test_admission_agrees_with_the_api_server(api: KubeClient) -> None:
    rng = random.Random(SEED)
    compared = refused = 0
    disagreements: list[str] = []
    started = time.monotonic()
    for case in range(CASES):
        quotas, claims = _case(rng)
        namespace = f"quota-case-{case}"
        ledger = _namespace(api, namespace, quotas)
        for claim in claims:
            claim["metadata"]["namespace"] = namespace
            refusals = ledger.admit(namespace, claim_usage(parse_claim(claim), EXTENDED))
            ours = {r.forbidden(claim["metadata"]["name"]) for r in refusals}
            theirs = refusal(api, f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims", claim)
            refused += theirs is not None
            compared += 1
            if not _agrees(ours, theirs):
                disagreements.append(
                    f"{namespace}: quotas {json.dumps([q['spec']['hard'] for q in quotas])}, "
                    f"{json.dumps(claim['spec'])}: API server: {theirs or 'created'}; "
                    f"ours: {sorted(ours) or 'created'}"
                )
        with contextlib.suppress(ApiError):
            api.request("DELETE", f"/api/v1/namespaces/{namespace}")
    print(
        f"\nquota agreement: {compared - len(disagreements)}/{compared} claims "
        f"({refused} refused by the API server) in {CASES} cases, {time.monotonic() - started:.1f} s"
    )
    assert disagreements == []
    assert 0 < refused < compared, "the generated cases should both admit and refuse"


WORKLOAD_CASES = 20
REFUSED = "FailedResourceClaimCreation"


def _settled(api: KubeClient, namespace: str, replicas: int) -> tuple[int, list[str]] | None:
    """(pods with their claim, the refusal messages of the others) once every pod has one or the
    other; None before."""
    pods = api.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    events = api.request("GET", f"/api/v1/namespaces/{namespace}/events")["items"]
    refused = {e["involvedObject"]["name"]: e["message"] for e in events if e.get("reason") == REFUSED}
    claimed = [p for p in pods if (p.get("status") or {}).get("resourceClaimStatuses")]
    others = [p["metadata"]["name"] for p in pods if p not in claimed]
    if len(pods) != replicas or any(name not in refused for name in others):
        return None
    return len(claimed), [refused[name] for name in others]


def test_workloads_agree_with_the_api_server(api: KubeClient) -> None:
    """A Deployment's pods each get a claim from its template, or are refused one (an event with
    the API server's message): as many as `check` admits, refused with one of its messages."""
    rng = random.Random(SEED + 1)
    pods = refused_pods = 0
    disagreements: list[str] = []
    for case in range(WORKLOAD_CASES):
        quotas, _ = _case(rng)
        namespace = f"quota-workload-{case}"
        ledger = _namespace(api, namespace, quotas)
        template = {**_claim(rng, "template"), "kind": "ResourceClaimTemplate"}
        template["spec"] = {"spec": template["spec"]}
        replicas = rng.randint(1, 4)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "work", "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "work"}},
                "template": {
                    "metadata": {"labels": {"app": "work"}},
                    "spec": {
                        "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": "template"}],
                        "containers": [
                            {"name": "c", "image": "none", "resources": {"claims": [{"name": "devices"}]}}
                        ],
                    },
                },
            },
        }
        template["metadata"]["namespace"] = namespace
        read = [(deployment, pod_extended_resources(deployment, {}))]
        outcomes = check(ledger, admissions([(template, parse_claim(template))], read, EXTENDED))
        ours_admitted = sum(1 for o in outcomes if not o.refusals)
        ours = {r.message for o in outcomes for r in o.refusals}
        api.request(
            "POST", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates", body=template
        )
        api.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body=deployment)
        found: tuple[int, list[str]] | None = None

        def settled(ns: str = namespace, count: int = replicas) -> bool:
            nonlocal found
            found = _settled(api, ns, count)
            return found is not None

        wait_until(settled, 60, f"the pods of {namespace} to get or be refused their claims")
        assert found is not None
        admitted, messages = found
        theirs = {m.split(" is forbidden: ", 1)[1] for m in messages}
        pods += replicas
        refused_pods += len(messages)
        if admitted != ours_admitted or not theirs <= ours:
            disagreements.append(
                f"{namespace}: quotas {json.dumps([q['spec']['hard'] for q in quotas])}, "
                f"{replicas} x {json.dumps(template['spec'])}: API server: {admitted} admitted, {theirs}; "
                f"ours: {ours_admitted}, {ours}"
            )
        with contextlib.suppress(ApiError):
            api.request("DELETE", f"/api/v1/namespaces/{namespace}")
    print(f"\nworkload agreement: {WORKLOAD_CASES - len(disagreements)}/{WORKLOAD_CASES} Deployments, "
          f"{pods} pods ({refused_pods} refused their claim)")  # fmt: skip
    assert disagreements == []
    assert 0 < refused_pods < pods, "the generated cases should both admit and refuse"


POD_CASES = 30
#: The extended resource the generated pods ask for, and the class that backs it.
POD_RESOURCE = EXTENDED["qx.example.com"]


def _pod_container(rng: random.Random, name: str, *, sidecar: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "none"}
    if rng.random() < 0.8:
        container["resources"] = {"limits": {POD_RESOURCE: str(rng.randint(0, 3))}}
    if sidecar:
        container["restartPolicy"] = "Always"
    return container


def _pod(rng: random.Random, name: str) -> dict[str, Any]:
    """A pod whose init containers (some of them sidecars) and containers ask for the resource."""
    spec: dict[str, Any] = {
        "containers": [_pod_container(rng, f"c{i}") for i in range(rng.randint(1, 3))],
        "initContainers": [
            _pod_container(rng, f"i{i}", sidecar=rng.random() < 0.4) for i in range(rng.randint(0, 3))
        ],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_pods_asking_an_extended_resource_agree_with_the_api_server(api: KubeClient) -> None:
    """What a pod's init containers, sidecars and containers count as `requests.<resource>`
    (`offline.extended`'s PodRequests): pods created one by one against a quota on it are
    admitted or refused as `check` says, with its message."""
    rng = random.Random(SEED + 2)
    backed = {POD_RESOURCE: "qx.example.com"}
    compared = refused = 0
    disagreements: list[str] = []
    for case in range(POD_CASES):
        namespace = f"quota-pods-{case}"
        hard = {f"requests.{POD_RESOURCE}": str(rng.randint(0, 6))}
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus"},
            "spec": {"hard": hard},
        }
        ledger = _namespace(api, namespace, [quota])
        for i in range(rng.randint(2, 4)):
            pod = _pod(rng, f"pod-{i}")
            read = [(pod, pod_extended_resources(pod, backed))]
            planned = admissions([], read, EXTENDED, namespace=namespace)
            usage = next((a.usage for a in planned if a.kind == "Pod"), {})
            ours = {r.forbidden(f"pod-{i}", "pods") for r in ledger.admit(namespace, usage)}
            theirs = refusal(api, f"/api/v1/namespaces/{namespace}/pods", pod)
            refused += theirs is not None
            compared += 1
            if not _agrees(ours, theirs):
                disagreements.append(
                    f"{namespace}: {hard}, {json.dumps(pod['spec'])}: API server: {theirs or 'created'}; "
                    f"ours: {sorted(ours) or 'created'}"
                )
        with contextlib.suppress(ApiError):
            api.request("DELETE", f"/api/v1/namespaces/{namespace}")
    print(f"\npod agreement: {compared - len(disagreements)}/{compared} pods ({refused} refused)")
    assert disagreements == []
    assert 0 < refused < compared, "the generated cases should both admit and refuse"


def test_quota_examples_classes_and_a_migrated_quota_are_accepted(
    api: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API server accepts every example quota and optional class as written, and what
    `dradriver migrate` makes of a device-plugin quota."""
    api.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": "team-a"}})  # fmt: skip
    for path in sorted((REPO / "examples/quotas").glob("*.yaml")):
        for quota in load_documents(path):
            quota["metadata"]["name"] += "-" + path.stem
            api.request("POST", "/api/v1/namespaces/team-a/resourcequotas", body=quota)
    for path in sorted((REPO / "deviceclasses/optional").glob("*.yaml")):
        for cls in load_documents(path):
            api.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=cls)
    source = tmp_path / "device-plugin-quota.yaml"
    source.write_text(yaml.safe_dump(DEVICE_PLUGIN_QUOTA))
    assert main(["migrate", str(source), "-o", "json"]) == 0
    [migrated] = json.loads(capsys.readouterr().out)["files"][0]["objects"][0]["outputs"]
    api.request("POST", "/api/v1/namespaces/team-a/resourcequotas", body=migrated)
