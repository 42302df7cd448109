"""List-typed attributes (DRAListTypeAttributes, alpha in 1.36) with the gate off and on, against
dra-oracle with the gate set per line: the scheduler's match (outcome, message, cost), and for a
new selector the API server's compile verdict and estimated cost.
"""

from __future__ import annotations

from typing import Any

import pytest

from dradriver.cel import CELCompileError, CELRuntimeError, compile_selector, to_cel_device
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
