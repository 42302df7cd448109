"""`dradriver cel eval`, `dry-run` and `validate` run as real subprocesses on real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.manifests import DEVICECLASSES
from tests.offline.cel.cel_fixtures import DRIVER, gpu_device

A = f'device.attributes["{DRIVER}"]'

DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {
        "selectors": [
            {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
            {"cel": {"expression": f'{A}.type == "gpu"'}},
        ]
    },
}


def claim(*selectors: str, count: int = 1, name: str = "c", device_class: str = DRIVER) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def resource_slice(count: int = 3) -> dict[str, Any]:
    devices = []
    for i in range(count):
        device = gpu_device(f"gpu-{i}")
        device["attributes"]["minor"] = {"int": i}
        devices.append(device)
    return slice_of(devices)


def slice_of(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """node-a's one ResourceSlice of DRIVER, holding `devices`."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpus"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-a",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Lark's parser tables are cached per user; keep the tests' cache out of $HOME.
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "class": tmp_path / "class.yaml",
        "slices": tmp_path / "slices.json",
        "claim": tmp_path / "claim.yaml",
    }
    paths["class"].write_text(yaml.safe_dump(DEVICE_CLASS))
    paths["slices"].write_text(json.dumps(resource_slice()))
    paths["claim"].write_text(yaml.safe_dump(claim(f"{A}.minor >= 1", count=2)))
    return paths


def dradriver(
    cache_home: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache_home), **(env or {})}
    environment = {k: v for k, v in environment.items() if not k.startswith("DRADRIVER_") or k in (env or {})}
    return subprocess.run(
        [sys.executable, "-m", "dradriver", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=environment,
        timeout=60,
    )


# -- cel eval -----------------------------------------------------------------------------------------


def test_cel_eval_reports_each_device(cache_home: Path, files: dict[str, Path]) -> None:
    result = dradriver(
        cache_home, "cel", "eval", "-e", f"{A}.minor >= 1", "--slices", str(files["slices"]), "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert [(d["device"], d["result"]) for d in payload["devices"]] == [
        ("gpu-0", False),
        ("gpu-1", True),
        ("gpu-2", True),
    ]
    assert payload["summary"] == {"true": 2, "false": 1, "error": 0}


def test_cel_eval_runtime_errors_are_per_device_and_exit_zero(
    cache_home: Path, files: dict[str, Path]
) -> None:
    expression = f'{A}.driverVersion == "550.54.15"'
    result = dradriver(
        cache_home, "cel", "eval", "-e", expression, "--slices", str(files["slices"]), "-o", "json"
    )
    assert result.returncode == 0
    payload = json.loads(result.stdout)
    assert {d["error"] for d in payload["devices"]} == {"no such overload"}
    assert payload["hints"][0]["corrected"] == f'{A}.driverVersion == semver("550.54.15")'


def test_cel_eval_list_attributes_follow_the_feature_gate(cache_home: Path, tmp_path: Path) -> None:
    listed = resource_slice(1)
    listed["spec"]["devices"][0]["attributes"]["ids"] = {"ints": [1, 2]}
    path = tmp_path / "listed.json"
    path.write_text(json.dumps(listed))
    base = ("cel", "eval", "--slices", str(path), "-o", "json")
    # DRAListTypeAttributes off (the 1.36 default): the scheduler cannot read the device at all,
    # and attribute values are not lists to range over.
    off = dradriver(cache_home, *base, "-e", f"{A}.ids.includes(2)")
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["devices"][0]["error"] == "attribute ids: unsupported attribute value"
    ranged = dradriver(cache_home, *base, "-e", f"{A}.ids.exists(i, i == 1)")
    assert ranged.returncode == 2
    assert "expression of type 'any' cannot be range of a comprehension" in ranged.stdout
    both = (*base, "-e", f"{A}.ids.includes(2) && {A}.ids.exists(i, i == 1)")
    on = dradriver(cache_home, *both, "--feature-gates", "DRAListTypeAttributes=true")
    assert on.returncode == 0, on.stderr
    assert json.loads(on.stdout)["summary"] == {"true": 1, "false": 0, "error": 0}
    unknown = dradriver(cache_home, *both, "--feature-gates", "DRAListTypes=true")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines() == [
        "dradriver cel eval: error: argument --feature-gates: unknown feature gate 'DRAListTypes' "
        "(dradriver follows: DRAExtendedResource, DRAListTypeAttributes) (see 'dradriver cel eval --help')"
    ]


def test_cel_eval_table_output(cache_home: Path, files: dict[str, Path]) -> None:
    result = dradriver(cache_home, "cel", "eval", "-e", f"{A}.nope == 1", "--slices", str(files["slices"]))
    assert result.returncode == 0
    assert "node-a/gpu-0" in result.stdout
    assert "no such key: nope" in result.stdout
    assert "0 true, 0 false, 3 error of 3 devices" in result.stdout


def test_cel_eval_compile_error_exits_2_with_hint(cache_home: Path, files: dict[str, Path]) -> None:
    result = dradriver(
        cache_home,
        "cel",
        "eval",
        "-e",
        'device.attributes["productName"] == "x"',
        "--slices",
        str(files["slices"]),
    )
    assert result.returncode == 2
    assert "found no matching overload for '_==_'" in result.stderr
    assert f'try: device.attributes["{DRIVER}"].productName == "x"' in result.stderr
    assert "Traceback" not in result.stderr


def test_cel_eval_compile_error_in_json(cache_home: Path, files: dict[str, Path]) -> None:
    result = dradriver(cache_home, "cel", "eval", "-e", "1 +", "--slices", str(files["slices"]), "-o", "json")
    assert result.returncode == 2
    assert json.loads(result.stdout)["error"]["kind"] == "compile"


def test_cel_eval_bad_input_is_one_line_exit_2(cache_home: Path, tmp_path: Path) -> None:
    missing = dradriver(cache_home, "cel", "eval", "-e", "true", "--slices", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1
    assert "nope.yaml: cannot read" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nspec: {driver: x, pool: {}}\n")
    result = dradriver(cache_home, "cel", "eval", "-e", "true", "--slices", str(broken))
    assert result.returncode == 2
    assert "broken.yaml:1: ResourceSlice <unnamed>: spec.pool.name: required" in result.stderr
    none = dradriver(cache_home, "cel", "eval", "-e", "true")
    assert none.returncode == 2
    assert "no device inventory" in none.stderr


def test_cel_eval_accepts_v1beta1_slices_from_the_environment(cache_home: Path, tmp_path: Path) -> None:
    body = {k: v for k, v in gpu_device().items() if k != "name"}
    beta = resource_slice(0)
    beta["apiVersion"] = "resource.k8s.io/v1beta1"
    beta["spec"]["devices"] = [{"name": "gpu-7", "basic": body}]
    path = tmp_path / "beta.yaml"
    path.write_text(yaml.safe_dump(beta))
    result = dradriver(
        cache_home,
        "cel",
        "eval",
        "-e",
        f'{A}.type == "gpu"',
        "-o",
        "json",
        env={"DRADRIVER_SLICES": str(path)},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["devices"][0]["result"] is True


# -- dry-run ---------------------------------------------------------------------------------------------

# The documented `dradriver dry-run -o json` schema (docs/tools.md, "dry-run JSON output").
SELECTOR = {
    "type": "object",
    "required": ["source", "index", "expression", "outcome", "message"],
    "properties": {
        "source": {"type": "string"},
        "index": {"type": "integer"},
        "expression": {"type": "string"},
        "outcome": {"enum": ["true", "false", "error", "skipped"]},
        "message": {"type": ["string", "null"]},
    },
}
DRY_RUN_SCHEMA = {
    "type": "object",
    "required": ["schemaVersion", "satisfiable", "node", "error", "compileErrors", "nodes", "hints"],
    "properties": {
        "schemaVersion": {"const": 1},
        "satisfiable": {"type": "boolean"},
        "node": {"type": ["string", "null"]},
        "error": {"type": ["string", "null"]},
        "compileErrors": {"type": "array"},
        "hints": {
            "type": "array",
            "items": {"type": "object", "required": ["expression", "message", "corrected"]},
        },
        "nodes": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["node", "satisfiable", "error", "reason", "warnings", "claims"],
                "properties": {
                    "claims": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": [
                                "kind",
                                "namespace",
                                "name",
                                "preallocated",
                                "allocation",
                                "reason",
                                "requests",
                            ],
                            "properties": {
                                "allocation": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": [
                                            "request",
                                            "driver",
                                            "pool",
                                            "device",
                                            "adminAccess",
                                            "shareID",
                                            "consumedCapacity",
                                        ],
                                        "properties": {
                                            "shareID": {"type": ["string", "null"]},
                                            "consumedCapacity": {
                                                "type": ["object", "null"],
                                                "additionalProperties": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                                "requests": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": [
                                            "name",
                                            "deviceClassName",
                                            "allocationMode",
                                            "count",
                                            "adminAccess",
                                            "selected",
                                            "matchingDevices",
                                            "devices",
                                        ],
                                        "properties": {
                                            "devices": {
                                                "type": "array",
                                                "items": {
                                                    "type": "object",
                                                    "required": ["device", "matches", "error", "selectors"],
                                                    "properties": {
                                                        "selectors": {"type": "array", "items": SELECTOR}
                                                    },
                                                },
                                            }
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
        },
    },
}


def dry_run(cache_home: Path, files: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    return dradriver(
        cache_home,
        "dry-run",
        "--claim",
        str(files["claim"]),
        "--class",
        str(files["class"]),
        "--slices",
        str(files["slices"]),
        *extra,
    )


def test_dry_run_satisfiable_json_follows_the_schema(cache_home: Path, files: dict[str, Path]) -> None:
    result = dry_run(cache_home, files, "-o", "json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    jsonschema.validate(payload, DRY_RUN_SCHEMA)
    assert payload["satisfiable"] is True
    assert payload["node"] == "node-a"
    claim_json = payload["nodes"][0]["claims"][0]
    assert [a["device"] for a in claim_json["allocation"]] == ["gpu-1", "gpu-2"]
    gpu0 = claim_json["requests"][0]["devices"][0]
    assert [s["outcome"] for s in gpu0["selectors"]] == ["true", "true", "false"]


def test_dry_run_table_explains_per_device(cache_home: Path, files: dict[str, Path]) -> None:
    result = dry_run(cache_home, files)
    assert result.returncode == 0
    assert "Node node-a: SATISFIABLE" in result.stdout
    assert "2 of 3 devices match" in result.stdout
    assert "gpu → gpu.dradriver.dev/node-a/gpu-1" in result.stdout


def test_dry_run_unsatisfiable_exits_1_with_reason(cache_home: Path, files: dict[str, Path]) -> None:
    files["claim"].write_text(yaml.safe_dump(claim(count=4)))
    result = dry_run(cache_home, files, "-o", "json")
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    jsonschema.validate(payload, DRY_RUN_SCHEMA)
    assert payload["nodes"][0]["reason"] == (
        "claim default/c: request gpu needs 4 device(s) of class gpu.dradriver.dev, "
        "3 of 3 match its selectors"
    )


def test_dry_run_cel_runtime_error_exits_1_with_the_scheduler_message(
    cache_home: Path, files: dict[str, Path]
) -> None:
    files["claim"].write_text(yaml.safe_dump(claim(f'"{DRIVER}" in device.attributes && {A}.nope')))
    result = dry_run(cache_home, files, "-o", "json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["nodes"][0]["error"] == (
        "claim default/c: selector #0: CEL runtime error: no such key: nope"
    )


def test_dry_run_gives_up_after_the_timeout_with_the_scheduler_message(
    cache_home: Path, files: dict[str, Path]
) -> None:
    # Six one-GPU claims, then one that needs more GPUs than are left: the exhaustive search
    # tries every placement of the six before it can say no, as the scheduler's does.
    files["slices"].write_text(json.dumps(resource_slice(16)))
    claims = [claim(name=f"c{i}") for i in range(6)] + [claim(count=11, name="big")]
    files["claim"].write_text(yaml.safe_dump_all(claims))
    result = dry_run(cache_home, files, "--timeout", "0.5", "-o", "json")
    assert result.returncode == 1, result.stderr
    payload = json.loads(result.stdout)
    jsonschema.validate(payload, DRY_RUN_SCHEMA)
    assert payload["nodes"][0]["error"] == "node node-a: timed out trying to allocate devices"
    bad = dry_run(cache_home, files, "--timeout", "-1")
    assert bad.returncode == 2
    assert "argument --timeout: invalid duration '-1'" in bad.stderr


def test_dry_run_compile_error_exits_2_with_hint(cache_home: Path, files: dict[str, Path]) -> None:
    files["claim"].write_text(yaml.safe_dump(claim(f"{A}.compute.major >= 8 && device.foo")))
    result = dry_run(cache_home, files)
    assert result.returncode == 2
    assert (
        "claim.yaml:1: claim default/c, request gpu selector #0: compilation failed: ERROR: <input>:1:"
        in result.stderr
    )
    assert f"try: {A}.computeMajor >= 8 && device.foo" in result.stderr


def test_dry_run_invalid_claim_names_the_field(cache_home: Path, files: dict[str, Path]) -> None:
    broken = claim()
    del broken["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
    files["claim"].write_text(yaml.safe_dump(broken))
    result = dry_run(cache_home, files)
    assert result.returncode == 2
    assert "spec.devices.requests[0].exactly.deviceClassName: required" in result.stderr


def test_dry_run_cluster_without_access_is_a_clear_error(
    cache_home: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    result = dradriver(
        cache_home, "dry-run", "--claim", str(files["claim"]), "--cluster", env={"HOME": str(tmp_path)}
    )
    assert result.returncode == 2
    assert (
        result.stderr
        == "dradriver dry-run: error: no Kubernetes API access: pass --kubeconfig or set KUBECONFIG\n"
    )


def test_dry_run_uses_the_builtin_deviceclasses_by_default(
    cache_home: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    # Without --class the repository's deviceclasses/ (shipped in the package) decide, wherever
    # dry-run runs: a deviceclasses/ directory in the working directory is not consulted.
    (tmp_path / "deviceclasses").mkdir()
    (tmp_path / "deviceclasses" / "gpu.yaml").write_text(
        yaml.safe_dump({**DEVICE_CLASS, "spec": {"selectors": [{"cel": {"expression": "false"}}]}})
    )
    result = dradriver(
        cache_home,
        "dry-run",
        "--claim",
        str(files["claim"]),
        "--slices",
        str(files["slices"]),
        "-o",
        "json",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    (builtin,) = yaml.safe_load_all((DEVICECLASSES / "gpu.yaml").read_text())
    (request,) = json.loads(result.stdout)["nodes"][0]["claims"][0]["requests"]
    class_selectors = [
        s["expression"] for s in request["devices"][0]["selectors"] if s["source"].startswith("class")
    ]
    assert class_selectors == [s["cel"]["expression"] for s in builtin["spec"]["selectors"]]


# -- validate --------------------------------------------------------------------------------------------


def test_validate_accepts_valid_objects(cache_home: Path, files: dict[str, Path]) -> None:
    result = dradriver(cache_home, "validate", str(files["class"]), str(files["claim"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 object(s) valid" in result.stderr


def test_validate_reports_file_doc_path_findings(cache_home: Path, tmp_path: Path) -> None:
    bad = claim("device.foo", count=0, name="Bad_Name")
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu"}]}}},
    }
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all([DEVICE_CLASS, bad, template]))
    result = dradriver(cache_home, "validate", str(path))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert f'{path}:2:metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain' in lines[0]
    assert any(
        line.startswith(
            f"{path}:2:spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value:"
        )
        and "undefined field 'foo'" in line
        for line in lines
    )
    assert (
        f"{path}:2:spec.devices.requests[0].exactly.count: Invalid value: 0: must be greater than zero"
        in lines
    )
    assert (
        f"{path}:3:spec.spec.devices.requests[0]: Required value: "
        "exactly one of `exactly` or `firstAvailable` is required"
    ) in lines


def test_validate_unreadable_file_exits_2(cache_home: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: [unclosed\n")
    result = dradriver(cache_home, "validate", str(path))
    assert result.returncode == 2
    assert "invalid YAML" in result.stderr
    assert "Traceback" not in result.stderr


# -- inputs from the other parts of dradriver ------------------------------------------------------


def test_cel_eval_on_a_fake_gpu_profile(cache_home: Path) -> None:
    result = dradriver(
        cache_home,
        "cel", "eval", "-e", f'{A}.productName.startsWith("NVIDIA A100") && {A}.type == "mig"',
        "--fake-gpus", "dgx-a100-mig", "-o", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout)
    rows = outcomes["devices"] if isinstance(outcomes, dict) else outcomes
    matched = [r for r in rows if r.get("result") is True]
    assert len(matched) == 4 * 3 + 2 * 7  # the MIG devices of GPUs 0-3 and 4-5 (see the profile)
    assert all("-mig-" in r["device"] for r in matched)


def test_validate_checks_rendered_slices_and_our_opaque_config(cache_home: Path, tmp_path: Path) -> None:
    rendered = dradriver(cache_home, "slices", "--fake-gpus", "dgx-h100", "--node-name", "n1", "-o", "json")
    assert rendered.returncode == 0, rendered.stderr
    good = tmp_path / "slices.json"
    good.write_text(rendered.stdout)
    assert dradriver(cache_home, "validate", str(good)).returncode == 0
    broken = json.loads(rendered.stdout)
    broken[0]["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "535.104.05"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(broken))
    result = dradriver(cache_home, "validate", str(bad))
    assert result.returncode == 1
    assert "spec.devices[0].attributes.driverVersion" in result.stdout
    assert "semver" in result.stdout
    config_claim = claim(f"{A}.minor >= 1")
    config_claim["spec"]["devices"]["config"] = [
        {
            "opaque": {
                "driver": "gpu.dradriver.dev",
                "parameters": {
                    "apiVersion": "gpu.dradriver.dev/v1alpha1",
                    "kind": "GpuConfig",
                    "sharing": {"strategy": "Sometimes"},
                },
            }
        }
    ]
    path = tmp_path / "claim.yaml"
    path.write_text(yaml.safe_dump(config_claim))
    result = dradriver(cache_home, "validate", str(path))
    assert result.returncode == 1
    assert (
        "spec.devices.config[0].opaque.parameters.sharing.strategy: Input should be 'TimeSlicing' or 'MPS'"
        in result.stdout
    )
