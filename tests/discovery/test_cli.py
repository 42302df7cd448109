"""`dradriver discover` and `dradriver slices` as users run them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import dradriver.slices as slices_module
from dradriver.cli import main
from dradriver.slices import build_node_slices, validate_slices

DRIVER = "gpu.dradriver.dev"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("DRADRIVER_") or name == "NODE_NAME":
            monkeypatch.delenv(name)


def test_slices_prints_multi_document_yaml_a_fresh_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRADRIVER_")}
    result = subprocess.run(
        [sys.executable, "-m", "dradriver", "slices", "--fake-gpus", "dgx-a100-mig", "--node-name", "node-a"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("---\napiVersion: resource.k8s.io/v1\n")
    documents = list(yaml.safe_load_all(result.stdout))
    assert documents == build_node_slices("dgx-a100-mig", node_name="node-a", driver_name=DRIVER)


def test_discover_and_slices_do_not_import_the_kubernetes_client() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from dradriver.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['slices', '--fake-gpus', 't4x4', '--node-name', 'n1'])\n"
        "    main(['discover', '--fake-gpus', 'mixed', '-o', 'json'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'kubernetes', 'grpc', 'pynvml'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_slices_json_with_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["slices", "--fake-gpus", "mixed", "--node-name", "n1", "--driver-name", "gpu.example.com"]
    assert main([*args, "--partitionable", "-o", "json"]) == 0
    slices = json.loads(capsys.readouterr().out)
    assert validate_slices(slices) == []
    assert {s["spec"]["driver"] for s in slices} == {"gpu.example.com"}
    assert "sharedCounters" in slices[-1]["spec"]


def test_slices_flags_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRADRIVER_FAKE_GPUS", "t4x4")
    monkeypatch.setenv("NODE_NAME", "from-node-name")
    monkeypatch.setenv("DRADRIVER_OUTPUT", "json")
    assert main(["slices"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["spec"]["nodeName"] == "from-node-name"
    monkeypatch.setenv("DRADRIVER_NODE_NAME", "from-dradriver")  # wins over NODE_NAME
    monkeypatch.setenv("DRADRIVER_PARTITIONABLE", "true")
    assert main(["slices"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["spec"]["nodeName"] == "from-dradriver"


def test_slices_default_node_name_is_the_hostname(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["slices", "--fake-gpus", "t4x4", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["spec"]["nodeName"] == socket.gethostname().lower()


def test_slices_rejects_a_bad_node_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["slices", "--fake-gpus", "t4x4", "--node-name", "Node_1"])
    assert caught.value.code == 2
    assert "invalid node name 'Node_1'" in capsys.readouterr().err


def test_slices_exits_1_with_the_validator_findings(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """If rendering ever produced something the API server rejects, nothing is printed but why."""
    render = slices_module.render_slices

    def broken_render(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        slices = render(*args, **kwargs)
        slices[0]["spec"]["devices"][2]["attributes"]["compute.major"] = {"int": 9}
        return slices

    monkeypatch.setattr(slices_module, "render_slices", broken_render)
    assert main(["slices", "--fake-gpus", "t4x4", "--node-name", "n1"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "1 problem(s) in the rendered slices" in captured.err
    assert "[0].spec.devices[2].attributes[compute.major]: a valid C identifier" in captured.err


def test_very_long_node_names_still_give_valid_slices(capsys: pytest.CaptureFixture[str]) -> None:
    node = ".".join(["a" * 62] * 4)  # 251 characters, a valid node name
    assert main(["slices", "--fake-gpus", "t4x4", "--node-name", node, "-o", "json"]) == 0
    [only] = json.loads(capsys.readouterr().out)
    assert only["spec"]["nodeName"] == node
    assert only["metadata"]["generateName"].startswith(f"00000-{DRIVER}-aaaa")
    assert len(only["metadata"]["generateName"]) <= 253


def test_bad_profile_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "node.yaml"
    profile.write_text("driverVersion: '1'\ncudaDriverVersion: '12.4'\ngpus: [{productName: x}]\n")
    assert main(["slices", "--fake-gpus", str(profile)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"invalid fake GPU profile {profile}: gpus[0].architecture: Field required" in err


def test_discover_json_has_devices_and_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--fake-gpus", "dgx-a100-mig", "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["driverVersion"], report["cudaDriverVersion"]) == ("535.104.05", "12.2")
    by_name = {d["name"]: d for d in report["devices"]}
    mig = by_name["gpu-0-mig-3g40gb-0"]
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"}
    caps_major = report["nvidiaCapsMajor"]
    assert isinstance(caps_major, int)
    assert mig["hardware"] == {
        "kind": "mig",
        "parentMinor": 0,
        "gpuInstance": 1,
        "computeInstance": 0,
        "placement": {"start": 0, "size": 4},
        "deviceNodes": ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"],
    }
    assert by_name["gpu-7"]["hardware"] == {
        "kind": "gpu",
        "index": 7,
        "minor": 7,
        "deviceNode": "/dev/nvidia7",
        "charDevice": "195:7",
    }
    assert report["skipped"] == []
    assert report["warnings"] == []


def test_discover_yaml_partitionable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--fake-gpus", "mixed", "--partitionable", "-o", "yaml"]) == 0
    report = yaml.safe_load(capsys.readouterr().out)
    assert [c["name"] for c in report["counterSets"]] == ["gpu-3-counters"]
    placement = next(d for d in report["devices"] if d["name"] == "gpu-3-mig-1g5gb-3")
    assert placement["hardware"]["kind"] == "mig-placement"
    assert placement["hardware"]["createdOn"] == "prepare"
    # The operator's 3g.20gb, 2g.10gb and 1g.5gb leave slice 3: nothing larger fits.
    assert "gpu-3-mig-7g40gb-0" not in {d["name"] for d in report["devices"]}


def test_discover_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--fake-gpus", "mixed"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA driver 575.57.08, CUDA 12.9" in out
    for text in ("gpu-0", "NVIDIA L40S", "gpu-3-mig-3g20gb-4", "3g.20gb", "20096Mi", "0000:42:00.0"):
        assert text in out


def test_discover_without_gpus_or_driver_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--fake-gpus", "no-such-profile"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown fake GPU profile 'no-such-profile'" in err
