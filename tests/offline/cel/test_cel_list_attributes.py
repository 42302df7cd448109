"""List-typed attributes (DRAListTypeAttributes, alpha in 1.36) with the gate off and on, against
dra-oracle with the gate set per line: the scheduler's match (outcome, message, cost), and for a
new selector the API server's compile verdict and estimated cost; `validate` and `dry-run` with
`--feature-gates` give the API server's findings and the scheduler's verdict for each setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dradriver.offline.cel import CELCompileError, CELRuntimeError, compile_selector, to_cel_device
from tests.offline.cel.test_cel_cli import claim as cli_claim
from tests.offline.cel.test_cel_cli import dradriver, slice_of
from tests.oracle import Oracle

DRIVER = "gpu.dradriver.dev"
A = f'device.attributes["{DRIVER}"]'
ATTRIBUTES: dict[str, Any] = {
    "type": {"string": "gpu"},
    "minor": {"int": 3},
    "ids": {"ints": [1, 2]},
    "names": {"strings": ["a", "b"]},
    "flags": {"bools": [True]},
    "versions": {"versions": ["1.2.3", "2.0.0"]},
    "empty": {"ints": []},
}
EXPRESSIONS = [
    "true",
    f"{A}.type == 'gpu'",
    f"{A}.ids == [1, 2]",
    f"{A}.ids.includes(2) && !{A}.ids.includes(5)",
    f'{A}.names.includes("b")',
    f'{A}.names.exists(n, n == "a")',
    f'{A}.versions.exists(v, v.isGreaterThan(semver("1.5.0")))',
    f'{A}.versions.includes(semver("2.0.0"))',
    f"{A}.empty.size() == 0",
    f"{A}.flags[0]",
    f"{A}.flags",
    f"{A}.ids.sum() == 3 && 1 in {A}.ids",
    f'{A}.type.includes("gpu") && {A}.minor.includes(3.0)',
    f'{A}.ids.includes("1")',
    f"{A}.type.exists(c, true)",
    f"{A}.type",
    "dyn(true)",
    f"{A}.all(name, {A}[name] != 0)",
    f"{A}.?ids.orValue([]).size() == 2",
]


def ours(expression: str, gate: bool) -> tuple[Any, ...]:
    try:
        selector = compile_selector(expression, list_type_attributes=gate)
    except CELCompileError as err:
        return ("compileError", err.message)
    device = to_cel_device({"name": "d", "attributes": ATTRIBUTES}, DRIVER, list_type_attributes=gate)
    try:
        evaluation = selector.evaluate(device, DRIVER)
    except CELRuntimeError as err:
        return ("runtimeError", err.message)
    return ("result", evaluation.matched, evaluation.cost)


def theirs(oracle: Oracle, expression: str, gate: bool) -> tuple[Any, ...]:
    answer = oracle.ask_ok(
        {
            "expression": expression,
            "driver": DRIVER,
            "attributes": ATTRIBUTES,
            "features": {"DRAListTypeAttributes": gate},
        }
    )
    if "result" in answer:
        return ("result", answer["result"], answer["cost"])
    kind = "compileError" if "compileError" in answer else "runtimeError"
    return (kind, answer[kind])


@pytest.mark.parametrize("gate", [False, True], ids=["gate-off", "gate-on"])
@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_list_attributes_agree_with_kubernetes(cel_oracle: Oracle, expression: str, gate: bool) -> None:
    mine, expected = ours(expression, gate), theirs(cel_oracle, expression, gate)
    if mine[0] == expected[0] == "runtimeError" and "unsupported attribute value" in str(expected[1]):
        # Gate off: the scheduler names the first list attribute it meets in Go's map order.
        assert "unsupported attribute value" in str(mine[1])
    else:
        assert mine == expected
    answer = cel_oracle.ask_ok(
        {"expression": expression, "mode": "validate", "features": {"DRAListTypeAttributes": gate}}
    )
    try:
        estimated = compile_selector(expression, cost_limit=2**64, new=True, list_type_attributes=gate)
    except CELCompileError:
        assert not answer["valid"], f"the API server accepts {expression!r}"
        return
    assert answer["valid"] or "too complex" in str(answer.get("validationErrors"))
    assert estimated.estimated_cost == answer["maxCost"]


# -- `--feature-gates` on `validate` and `dry-run`, run as subprocesses, against the oracle ------------

LISTED_SELECTOR = f"{A}.ids.exists(i, i == 2)"


def _class(expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "listed"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


@pytest.mark.parametrize("gate", [False, True], ids=["gate-off", "gate-on"])
def test_validate_follows_the_gate_as_the_api_server_does(
    cel_oracle: Oracle, tmp_path: Path, gate: bool
) -> None:
    path = tmp_path / "class.yaml"
    path.write_text(json.dumps(_class(LISTED_SELECTOR)))
    result = dradriver(tmp_path / "cache", "validate", str(path), "-o", "json", *_gate_flag(gate))
    answer = cel_oracle.ask_ok(
        {"expression": LISTED_SELECTOR, "mode": "validate", "features": {"DRAListTypeAttributes": gate}}
    )
    findings = json.loads(result.stdout)["findings"]
    assert result.returncode == (0 if answer["valid"] else 1), result.stderr
    expected = [
        (error["field"], error["message"].removeprefix(f"{error['field']}: "))
        for error in answer.get("validationErrors") or []
    ]
    assert [(f["path"], f["message"]) for f in findings] == expected


@pytest.mark.parametrize("gate", [False, True], ids=["gate-off", "gate-on"])
def test_dry_run_follows_the_gate_as_the_scheduler_does(
    allocate_oracle: Oracle, tmp_path: Path, gate: bool
) -> None:
    expression = f"{A}.ids.includes(2)"  # compiles either way; the device's list value does not
    # One list attribute only: with the gate off the scheduler names the first it meets in Go's
    # map order.
    device = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "ids": ATTRIBUTES["ids"]}}
    slice_ = slice_of([device])
    claim = cli_claim(device_class="listed")
    answer = allocate_oracle.ask(
        {
            "node": {"metadata": {"name": "node-a"}},
            "deviceClasses": [_class(expression)],
            "resourceSlices": [slice_],
            "claims": [claim],
            "features": {"DRAListTypeAttributes": gate},
        }
    )
    files = {"class": _class(expression), "slices": slice_, "claim": claim}
    for name, obj in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(obj))
    result = dradriver(
        tmp_path / "cache",
        "dry-run",
        "--claim",
        str(tmp_path / "claim.json"),
        "--class",
        str(tmp_path / "class.json"),
        "--slices",
        str(tmp_path / "slices.json"),
        "-o",
        "json",
        *_gate_flag(gate),
    )
    report = json.loads(result.stdout)["nodes"][0]
    if "results" in answer:
        assert result.returncode == 0, result.stdout
        ours = [(r["device"], r["request"]) for r in report["claims"][0]["allocation"]]
        (their_claim,) = answer["results"]
        assert ours == [(r["device"], r["request"]) for r in their_claim["allocation"]["devices"]["results"]]
    else:
        assert result.returncode == 1
        assert answer["error"] == (
            "class listed: selector #0: CEL runtime error: attribute ids: unsupported attribute value"
        )
        assert report["error"] == answer["error"]


def _gate_flag(gate: bool) -> tuple[str, ...]:
    return ("--feature-gates", f"DRAListTypeAttributes={str(gate).lower()}")
