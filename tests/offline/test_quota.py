"""ResourceQuota counting of claims, templates and workloads (pure; the API server's agreement is
test_quota_apiserver.py's), and `dry-run` / `validate` with --resource-quota."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.offline.allocation.model import parse_claim
from dradriver.offline.extended import pod_extended_resources
from dradriver.offline.quota import (
    CLAIM_COUNT,
    IMPLICIT_PREFIX,
    MAX_PODS,
    QuotaInputError,
    QuotaLedger,
    admissions,
    check,
    claim_usage,
    devices_name,
    parse_resource_quota,
)
from tests.deploy.manifests import REPO

GPU = "gpu.dradriver.dev"
GPUS = devices_name(GPU)


def claim(*requests: dict[str, Any], name: str = "c", kind: str = "ResourceClaim") -> dict[str, Any]:
    spec = {"devices": {"requests": list(requests)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"spec": spec} if kind == "ResourceClaimTemplate" else spec,
    }


def exactly(cls: str = GPU, count: int | None = 1, **extra: Any) -> dict[str, Any]:
    return {"name": f"r{count}", "exactly": {"deviceClassName": cls, "count": count, **extra}}


def quota(hard: dict[str, Any], name: str = "q", status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"hard": hard},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_usage_counts_devices_per_class_all_as_32_and_first_available_as_its_largest() -> None:
    first_available = {
        "name": "fa",
        "firstAvailable": [
            {"name": "a", "deviceClassName": GPU, "count": 3},
            {"name": "b", "deviceClassName": GPU, "count": 1},
            {"name": "c", "deviceClassName": "mig.gpu.dradriver.dev", "allocationMode": "All"},
        ],
    }
    usage = claim_usage(parse_claim(claim(exactly(count=2), first_available)), {})
    assert usage == {
        CLAIM_COUNT: 1,
        GPUS: 5,
        IMPLICIT_PREFIX + GPU: 5,
        devices_name("mig.gpu.dradriver.dev"): 32,
        IMPLICIT_PREFIX + "mig.gpu.dradriver.dev": 32,
    }


def test_usage_of_an_extended_resource_class_counts_its_name_too_with_the_gate_on() -> None:
    cls = "extended-resource.gpu.dradriver.dev"
    parsed = parse_claim(claim(exactly(cls, 2)))
    assert claim_usage(parsed, {cls: "nvidia.com/gpu"})["requests.nvidia.com/gpu"] == 2
    assert claim_usage(parsed, {cls: "nvidia.com/gpu"}, extended_resources=False) == {
        CLAIM_COUNT: 1,
        devices_name(cls): 2,
    }


def test_a_refused_claim_is_not_charged_and_gets_the_api_servers_message() -> None:
    ledger = QuotaLedger([parse_resource_quota(quota({GPUS: 2, CLAIM_COUNT: "10"}))])
    two = claim_usage(parse_claim(claim(exactly(count=2))), {})
    assert ledger.admit("team-a", two) == []
    [refusal] = ledger.admit("team-a", two)
    assert refusal.forbidden("c") == (
        'resourceclaims.resource.k8s.io "c" is forbidden: exceeded quota: q, '
        f"requested: {GPUS}=2, used: {GPUS}=2, limited: {GPUS}=2"
    )
    assert ledger.used(ledger.quotas[0])[CLAIM_COUNT].canonical() == "1"
    assert ledger.admit("other", two) == [], "a quota counts only its own namespace"


def test_a_quota_with_a_status_missing_an_entry_refuses_until_the_controller_fills_it() -> None:
    ledger = QuotaLedger([parse_resource_quota(quota({GPUS: 4}, status={"hard": {GPUS: "4"}, "used": {}}))])
    [refusal] = ledger.admit("team-a", {CLAIM_COUNT: 1, GPUS: 1})
    assert refusal.message == f"status unknown for quota: q, resources: {GPUS}"


def test_status_hard_and_used_are_what_admission_reads() -> None:
    parsed = parse_resource_quota(quota({GPUS: "4"}, status={"hard": {GPUS: "3"}, "used": {GPUS: "3"}}))
    assert parsed.hard[GPUS].canonical() == "3"
    [refusal] = QuotaLedger([parsed]).admit("team-a", {GPUS: 1})
    assert refusal.exceeded == (GPUS,)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (quota({GPUS: "four"}), f"ResourceQuota q: spec.hard[{GPUS}]: 'four': quantities must match"),
        (
            {**quota({}), "kind": "LimitRange"},
            "ResourceQuota q: kind: must be ResourceQuota, not 'LimitRange'",
        ),
        ({"kind": "ResourceQuota", "metadata": {}}, "ResourceQuota (unnamed): metadata.name: Field required"),
    ],
)
def test_bad_quotas_are_one_line_naming_object_and_field(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(QuotaInputError) as err:
        parse_resource_quota(obj)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_a_workload_makes_a_claim_per_pod_and_template_and_a_refused_pod_makes_none() -> None:
    template = claim(exactly(count=2), name="two", kind="ResourceClaimTemplate")
    pod_spec = {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two"}],
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"parallelism": 3, "template": {"spec": pod_spec}},
    }
    extended = {"extended-resource.gpu.dradriver.dev": "nvidia.com/gpu"}
    backed = {"nvidia.com/gpu": "extended-resource.gpu.dradriver.dev"}
    planned = admissions(
        [(template, parse_claim(template))],
        [(job, pod_extended_resources(job, backed))],
        extended,
        namespace="team-a",
    )
    assert [(a.kind, a.name) for a in planned[:3]] == [
        ("ResourceClaim", "train-0-gpus"),
        ("Pod", "train-0"),
        ("ResourceClaim", "train-0-extended-resources"),
    ]
    assert len(planned) == 9
    hard = {GPUS: 4, "requests.nvidia.com/gpu": 1, devices_name("extended-resource.gpu.dradriver.dev"): 4}
    outcomes = check(QuotaLedger([parse_resource_quota(quota(hard))], extended), planned)
    refused = [(o.admission.kind, o.admission.name) for o in outcomes if o.refusals]
    assert refused == [("Pod", "train-1"), ("ResourceClaim", "train-2-gpus"), ("Pod", "train-2")]
    assert ("ResourceClaim", "train-1-extended-resources") not in [
        (o.admission.kind, o.admission.name) for o in outcomes
    ]


def test_a_pod_s_extended_resource_request_defaults_from_its_limit_resource_by_resource() -> None:
    """A container requesting CPU and limiting nvidia.com/gpu asks requests.nvidia.com/gpu: 1."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": 1}}}
            ]
        },
    }
    extended = {"extended-resource.gpu.dradriver.dev": "nvidia.com/gpu"}
    backed = {"nvidia.com/gpu": "extended-resource.gpu.dradriver.dev"}
    planned = admissions([], [(pod, pod_extended_resources(pod, backed))], extended, namespace="team-a")
    outcomes = check(
        QuotaLedger([parse_resource_quota(quota({"requests.nvidia.com/gpu": 0}))], extended), planned
    )
    assert [(o.admission.kind, o.admission.name) for o in outcomes if o.refusals] == [("Pod", "p")]


def test_a_workload_of_a_billion_replicas_is_checked_for_its_first_thousand_pods() -> None:
    template = claim(exactly(), name="one", kind="ResourceClaimTemplate")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "huge", "namespace": "team-a"},
        "spec": {
            "replicas": 10**9,
            "template": {"spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "one"}]}},
        },
    }
    planned = admissions(
        [(template, parse_claim(template))], [(deployment, pod_extended_resources(deployment, {}))], {}
    )
    assert len(planned) == MAX_PODS


def write(tmp_path: Path, name: str, *objects: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(objects))
    return str(path)


def test_dry_run_and_validate_say_which_entry_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claims = write(
        tmp_path, "claims.yaml", claim(exactly(count=4), name="a"), claim(exactly(count=1), name="b")
    )
    quotas = str(REPO / "examples/quotas/gpus.yaml")
    code = main(["dry-run", "--claim", claims, "--fake-gpus", "dgx-h100", "--resource-quota", quotas])
    out = capsys.readouterr().out
    assert code == 1
    assert "ResourceClaim team-a/a: admitted" in out
    assert (
        f'the API server: resourceclaims.resource.k8s.io "b" is forbidden: exceeded quota: gpus, '
        f"requested: {GPUS}=1, used: {GPUS}=4, limited: {GPUS}=4"
    ) in out
    assert main(["validate", claims, "--resource-quota", quotas, "-o", "json"]) == 1
    report = yaml.safe_load(capsys.readouterr().out)
    assert [o["admitted"] for o in report["quota"]["objects"]] == [True, False]
    assert report["quota"]["objects"][1]["refusals"][0]["exceeded"] == [GPUS]


def test_a_bad_quota_file_is_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    claims = write(tmp_path, "claim.yaml", claim(exactly()))
    bad = write(tmp_path, "quota.yaml", quota({GPUS: "1.5.0"}))
    assert main(["validate", claims, "--resource-quota", bad]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"dradriver validate: error: {bad}:1: ResourceQuota q: spec.hard[{GPUS}]: ")
