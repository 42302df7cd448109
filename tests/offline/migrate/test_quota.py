"""`dradriver migrate` on device-plugin ResourceQuotas: what the quota becomes, and that it then
holds migrated workloads to what the device-plugin quota held them to (counted by
dradriver.offline.quota, which test_quota_apiserver.py holds to the real API server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main
from dradriver.offline.allocation.model import parse_claim
from dradriver.offline.extended import pod_extended_resources
from dradriver.offline.quota import QuotaLedger, admissions, check, devices_name, parse_resource_quota
from tests.deploy.manifests import OPTIONAL_DEVICECLASSES_DIR, deviceclasses

DEVICE_PLUGIN_QUOTA = {
    "apiVersion": "v1",
    "kind": "ResourceQuota",
    "metadata": {"name": "team-a", "namespace": "team-a"},
    "spec": {
        "hard": {
            "requests.cpu": "64",
            "requests.nvidia.com/gpu": 4,
            "limits.nvidia.com/gpu": "4",
            "requests.nvidia.com/mig-1g.10gb": "8",
            "requests.nvidia.com/mig-1g.10gb.me": "2",
            # A profile with no class of its own in deviceclasses/optional/.
            "requests.nvidia.com/mig-4g.96gb": "1",
        }
    },
}
TRAINER = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "trainer", "namespace": "team-a"},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "trainer"}},
        "template": {
            "metadata": {"labels": {"app": "trainer"}},
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 2}}}]
            },
        },
    },
}


def migrated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *objects: Any, driver: str = ""
) -> list[Any]:
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump_all(objects))
    flags = ["--driver-name", driver] if driver else []
    assert main(["migrate", str(source), *flags, "-o", "json"]) == 0, capsys.readouterr().err
    report = yaml.safe_load(capsys.readouterr().out)
    return [out for obj in report["files"][0]["objects"] for out in obj["outputs"]]


def test_a_gpu_cap_caps_the_gpu_class_and_closes_every_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [quota] = migrated(tmp_path, capsys, DEVICE_PLUGIN_QUOTA)
    hard = quota["spec"]["hard"]
    shipped = deviceclasses() | deviceclasses(OPTIONAL_DEVICECLASSES_DIR)
    full_gpu = {n for n, c in shipped.items() if '.type == "gpu"' in str(c["spec"]["selectors"])}
    assert {n: hard[devices_name(n)] for n in full_gpu} == {
        n: "4" if n == "gpu.dradriver.dev" else "0" for n in full_gpu
    }
    assert hard[devices_name("mig-1g-10gb.gpu.dradriver.dev")] == "8"
    assert hard[devices_name("mig-1g-10gb-me.gpu.dradriver.dev")] == "2", "the device plugin's 1g.10gb.me"
    assert hard[devices_name("mig.gpu.dradriver.dev")] == "11", (
        "the profiles' total, 4g.96gb (no class of its own) included"
    )
    assert not any(".4g.96gb" in k or "4g-96gb" in k for k in hard)
    assert hard["requests.cpu"] == "64"
    assert hard["requests.nvidia.com/gpu"] == 4
    assert "limits.nvidia.com/gpu" not in hard
    assert not any(k.startswith("requests.nvidia.com/mig-") for k in hard)


def test_the_migrated_quota_holds_the_migrated_workload_to_4_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outputs = migrated(tmp_path, capsys, DEVICE_PLUGIN_QUOTA, TRAINER)
    [quota] = [o for o in outputs if o["kind"] == "ResourceQuota"]
    templates = [o for o in outputs if o["kind"] == "ResourceClaimTemplate"]
    workloads = [o for o in outputs if o["kind"] == "Deployment"]
    read = [(w, pod_extended_resources(w, {})) for w in workloads]
    planned = admissions([(t, parse_claim(t)) for t in templates], read, {})
    outcomes = check(QuotaLedger([parse_resource_quota(quota)]), planned)
    assert [bool(o.refusals) for o in outcomes] == [False, False, True]
    assert outcomes[2].refusals[0].exceeded == (devices_name("gpu.dradriver.dev"),)


def test_another_driver_name_names_its_classes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    [quota] = migrated(tmp_path, capsys, DEVICE_PLUGIN_QUOTA, driver="gpu.example.com")
    hard = quota["spec"]["hard"]
    assert hard[devices_name("gpu.example.com")] == "4"
    assert hard[devices_name("h100.gpu.example.com")] == "0"
    assert hard[devices_name("mig-1g-10gb.gpu.example.com")] == "8"
    assert not any("dradriver.dev" in key for key in hard)


def test_a_quota_without_gpus_is_unchanged_and_a_bad_value_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = {**DEVICE_PLUGIN_QUOTA, "spec": {"hard": {"pods": "10"}}}
    assert migrated(tmp_path, capsys, plain) == [plain]
    bad = {**DEVICE_PLUGIN_QUOTA, "spec": {"hard": {"requests.nvidia.com/gpu": "four"}}}
    source = tmp_path / "bad.yaml"
    source.write_text(yaml.safe_dump(bad))
    assert main(["migrate", str(source)]) == 2
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if "four" in ln]
    assert line.startswith(
        f"{source}:1: ResourceQuota team-a/team-a: spec.hard[requests.nvidia.com/gpu]: 'four':"
    )
