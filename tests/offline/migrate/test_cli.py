"""`dradriver migrate` as an operator runs it: files, directories, stdin, comments, JSON report,
--output-dir, and problems as one line each with exit status 2."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dradriver.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
BATS = FIXTURES / "nvidia" / "tests" / "bats" / "specs"


def test_comments_explain_every_change(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", str(BATS / "gpu-timeslicing.yaml")]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[:8] == [
        "---",
        f"# dradriver migrate: {BATS / 'gpu-timeslicing.yaml'}:1: ResourceClaimTemplate rct-timeslicing-gpu: "
        "migrated",
        "#   spec.spec.devices.requests[0].exactly.deviceClassName: gpu.nvidia.com -> gpu.dradriver.dev "
        "(NVIDIA's class for full GPUs)",
        "#   spec.spec.devices.config[0].opaque.driver: gpu.nvidia.com -> gpu.dradriver.dev (our driver)",
        "#   spec.spec.devices.config[0].opaque.parameters.apiVersion: resource.nvidia.com/v1beta1 -> "
        "gpu.dradriver.dev/v1alpha1 (our config API)",
        "#   spec.spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig: timeSlicingConfig -> "
        "timeSlicing (our field name)",
        "apiVersion: resource.k8s.io/v1",
        "kind: ResourceClaimTemplate",
    ]
    assert err == "2 object(s) in 1 file(s): 1 migrated, 1 unchanged\n"
    documents = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in documents] == ["ResourceClaimTemplate", "Pod"]


def test_a_directory_with_problems_writes_the_good_files_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    given = tmp_path / "in"
    (given / "sub").mkdir(parents=True)
    shutil.copy(BATS / "gpu-simple-full.yaml", given / "full.yaml")
    shutil.copy(BATS / "gpu-simple-mig-ts.yaml", given / "sub" / "mig-ts.yaml")
    (given / "mig-parted.yaml").write_text("version: v1\nmig-configs: {}\n")
    (given / "notes.txt").write_text("not a manifest")
    out_dir = tmp_path / "out"
    assert main(["migrate", str(given), "--output-dir", str(out_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*")) == ["full.yaml"]
    assert err.splitlines() == [
        f"{given / 'mig-parted.yaml'}:1: not a Kubernetes object (no apiVersion or kind)",
        f"{given / 'sub' / 'mig-ts.yaml'}:1: ResourceClaimTemplate rct-mig1g-ts: "
        "spec.spec.devices.config[0].opaque.parameters.sharing.strategy: time-slicing on MIG devices has "
        "no equivalent: NVIDIA's driver accepts and ignores it, dradriver refuses it (a MIG device is "
        "already an isolated partition): drop the config, or use MPS",
        "5 object(s) in 3 file(s): 1 migrated, 2 unchanged, 2 failed; 2 file(s) not written, "
        "see the problems above",
    ]
    written = list(yaml.safe_load_all((out_dir / "full.yaml").read_text()))
    assert (
        written[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        == "gpu.dradriver.dev"
    )
    # Never over an input.
    assert main(["migrate", str(given / "full.yaml"), "--output-dir", str(given)]) == 2
    assert "would overwrite an input file" in capsys.readouterr().err


def test_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    spec = FIXTURES / "device-plugin" / "gfd-gpu-count.yaml"
    assert main(["migrate", str(spec), str(BATS / "gpu-anymig.yaml"), "-o", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["schemaVersion"] == 1
    assert report["driver"] == "gpu.dradriver.dev"
    refused, migrated = report["files"]
    assert (refused["source"], refused["migrated"]) == (str(spec), False)
    (pod,) = refused["objects"]
    assert (pod["object"], pod["outcome"], pod["outputs"]) == ("Pod eight-gpu-node", "failed", [])
    assert pod["problems"][0]["path"] == "spec.nodeSelector[nvidia.com/gpu.count]"
    assert migrated["migrated"] is True
    template = migrated["objects"][0]
    assert template["outcome"] == "migrated"
    assert template["changes"][0] == {
        "path": "spec.spec.devices.requests[0].exactly.deviceClassName",
        "from": "mig.nvidia.com",
        "to": "mig.gpu.dradriver.dev",
        "reason": "NVIDIA's class for MIG devices",
    }
    assert template["outputs"][0]["kind"] == "ResourceClaimTemplate"


def test_stdin_and_another_driver_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO((BATS / "gpu-anymig.yaml").read_text()))
    assert main(["migrate", "-", "--driver-name", "gpu.example.com"]) == 0
    out = capsys.readouterr().out
    assert "# dradriver migrate: -:1: ResourceClaimTemplate rct-anymig: migrated" in out
    template = next(yaml.safe_load_all(out))
    assert (
        template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        == "mig.gpu.example.com"
    )


def test_unreadable_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, message in (
        ([str(tmp_path / "missing.yaml")], "no such file or directory"),
        ([str(tmp_path)], "no *.yaml, *.yml or *.json files"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "dradriver", "migrate", *args], capture_output=True, text=True, check=False
        )
        assert result.returncode == 2
        assert len(result.stderr.splitlines()) == 1
        assert message in result.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [")
    result = subprocess.run(
        [sys.executable, "-m", "dradriver", "migrate", str(broken)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stderr.count("\n")) == (2, 1)
    assert "invalid YAML" in result.stderr
