"""dradriver.offline.cel against the real Kubernetes CEL code (dra-oracle), on generated selectors.

Every generated selector is compiled by both and evaluated on devices dradriver publishes for
the fake profiles. They must agree on the outcome class (compile error, runtime error, true,
false), on the messages a user sees (compile errors and runtime errors), on the actual cost and,
for the API server's validation (`dradriver validate`), on accept/reject, the field path, the
message and the estimated cost.

CI runs a fixed seed and a bounded number of examples; `make fuzz-cel` runs many more
(DRADRIVER_FUZZ_EXAMPLES, DRADRIVER_FUZZ_SEED). With DRADRIVER_FUZZ_REPORT=FILE the run
writes its counts there (bench/RESULTS.md quotes them).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from dradriver.offline.allocation.validation import validate_object
from dradriver.offline.cel import CELCompileError, CELRuntimeError, compile_selector, to_cel_device
from tests.offline.cel.selector_strategy import DRIVER, selectors
from tests.oracle import Oracle

EXAMPLES = int(os.environ.get("DRADRIVER_FUZZ_EXAMPLES", "800"))
SEED = int(os.environ.get("DRADRIVER_FUZZ_SEED", "14"))
REPORT = os.environ.get("DRADRIVER_FUZZ_REPORT")
PROFILES = (("dgx-h100", False), ("dgx-a100-mig", True), ("mixed", False), ("t4x4", False))

counts: dict[str, int] = {"expressions": 0, "cases": 0, "validations": 0}
#: How often a case whose cost differs is asked again, to see whether Kubernetes' cost varies.
MAP_ORDER_TRIES = 32


@functools.cache
def published_devices() -> list[dict[str, Any]]:
    """Every device dradriver publishes for the fake profiles (full GPUs, MIG devices, placements)."""
    from dradriver.slices import build_node_slices

    devices: list[dict[str, Any]] = []
    for profile, partitionable in PROFILES:
        for slice_ in build_node_slices(
            profile, node_name="node", driver_name=DRIVER, partitionable=partitionable
        ):
            devices.extend(slice_["spec"].get("devices") or [])
    return devices


def ours(expression: str, device: dict[str, Any]) -> tuple[str, Any, int | None]:
    try:
        selector = compile_selector(expression)
    except CELCompileError as err:
        return "compileError", err.message, None
    try:
        evaluation = selector.evaluate(to_cel_device(device, DRIVER), DRIVER)
    except CELRuntimeError as err:
        return "runtimeError", err.message, None
    return "result", evaluation.matched, evaluation.cost


def theirs(oracle: Oracle, expression: str, device: dict[str, Any]) -> tuple[str, Any, int | None]:
    answer = oracle.ask_ok(
        {
            "expression": expression,
            "driver": DRIVER,
            "attributes": device.get("attributes") or {},
            "capacity": device.get("capacity") or {},
            "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
        }
    )
    for kind in ("compileError", "runtimeError", "result"):
        if kind in answer:
            return kind, answer[kind], answer.get("cost") if kind == "result" else None
    raise AssertionError(f"unexpected oracle answer {answer}")


def our_validation(expression: str) -> list[dict[str, str]]:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "dra-oracle"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }
    return [
        {"field": f.path, "message": f"{f.path}: {f.message}"} for f in validate_object(device_class, DRIVER)
    ]


def check(oracle: Oracle, expression: str, device_indexes: list[int]) -> None:
    devices = published_devices()
    counts["expressions"] += 1
    for index in device_indexes:
        device = devices[index % len(devices)]
        mine, expected = ours(expression, device), theirs(oracle, expression, device)
        counts["cases"] += 1
        if mine != expected and mine[:2] == expected[:2]:
            expected = _cost_in_any_map_order(oracle, expression, device, mine, expected)
        assert mine == expected, f"{expression!r} on {device['name']}: ours {mine}, Kubernetes {expected}"
    answer = oracle.ask_ok({"expression": expression, "mode": "validate"})
    expected_errors = [
        {"field": e["field"], "message": e["message"]} for e in answer.get("validationErrors") or []
    ]
    counts["validations"] += 1
    assert our_validation(expression) == expected_errors, f"validate {expression!r}"
    if "maxCost" in answer:
        assert compile_selector(expression, cost_limit=2**64).estimated_cost == answer["maxCost"], (
            f"estimated cost of {expression!r}"
        )


def _cost_in_any_map_order(
    oracle: Oracle,
    expression: str,
    device: dict[str, Any],
    mine: tuple[str, Any, int | None],
    expected: tuple[str, Any, int | None],
) -> tuple[str, Any, int | None]:
    """Go iterates a map in a random order, so a macro over `device.attributes[...]` that stops
    early costs what the keys it met cost: Kubernetes gives such a selector different costs from
    call to call. Where it does, ours must be one of them."""
    costs = {theirs(oracle, expression, device)[2] for _ in range(MAP_ORDER_TRIES)} | {expected[2]}
    if len(costs) > 1 and mine[2] in costs:
        counts["mapOrderCosts"] = counts.get("mapOrderCosts", 0) + 1
        return mine
    return expected


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    if REPORT:
        Path(REPORT).write_text(json.dumps({"seed": SEED, "examples": EXAMPLES, **counts}) + "\n")


#: An index out of range on gpu-0 (minor 0): a runtime error for the regression examples below.
FAILS = '"".substring(device.attributes["gpu.dradriver.dev"].minor + 1)'
NAME = 'device.attributes["gpu.dradriver.dev"].productName'
ATTRS = 'device.attributes["gpu.dradriver.dev"].'


@pytest.mark.timeout(1800)
@seed(SEED)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(
    expression=selectors(),
    device_indexes=st.lists(st.integers(min_value=0, max_value=10_000), min_size=2, max_size=3),
)
# A macro over a map that stops at its first key: Kubernetes' cost depends on Go's map order.
@example(expression='device.attributes["gpu.dradriver.dev"].all(v0, device.driver == v0)', device_indexes=[0])
# A closer missing at the end: ANTLR inserts it, so cel-go's visitor also reports the bad has().
@example(expression='(has(device.attributes["resource.kubernetes.io"]["pciBusID"])', device_indexes=[0])
@example(expression='has(device.attributes["resource.kubernetes.io"]["pciBusID"]))', device_indexes=[0])
@example(expression="has(a[1]) ) && has(b[1]", device_indexes=[0])
@example(expression="(has(a[1]) &&", device_indexes=[0])
# `in` over dyn(...): several candidate overloads, so no set-membership plan; one unit.
@example(expression="1 in dyn([1])", device_indexes=[0])
@example(expression='quantity("1") in dyn([1])', device_indexes=[0])
# The element of `x in []` is planned all the same: a failing constant conversion inside it fails.
@example(expression='(double("") + 0.0) in []', device_indexes=[0])
# A conversion of a constant map literal is folded while planning.
@example(expression='"a" in dyn({"a": 1})', device_indexes=[0])
@example(expression='type({"a": 1}) == map', device_indexes=[0])
# evalVarArgs (precompiled regex, three arguments, format, dynamic dispatch) stops at an
# argument's error and its call is not charged; `&&`/`||` absorb the error.
@example(expression=FAILS + '.matches("^NVIDIA") && false', device_indexes=[0])
@example(expression=FAILS + '.matches("^NVIDIA") || true', device_indexes=[0])
@example(expression=FAILS + '.find("x") == "" || true', device_indexes=[0])
@example(expression=FAILS + '.replace("a", "b") == "" || true', device_indexes=[0])
@example(expression=FAILS + '.format([]) == "" || true', device_indexes=[0])
@example(expression=f"cidr({FAILS}).containsIP({NAME}) || true", device_indexes=[0])
@example(expression=f"dyn({FAILS}).indexOf({NAME}) == 0 || true", device_indexes=[0])
# A list or map literal is charged even when one of its elements fails.
@example(expression=f'["a", {FAILS}].size() == 0 || true', device_indexes=[0])
@example(expression=f'{{"a": {FAILS}}}.size() == 0 || true', device_indexes=[0])
# A cost priced by the call's result (join, slice, lists.range) counts an error result as size 1;
# containsIP/containsCIDR add the parse of the argument for the `_string` overload id only.
@example(expression=f'["a", "b", "c", "d", "e", "f", "g"].join({FAILS}) == "" || true', device_indexes=[0])
@example(expression=f'[{FAILS}].join(",") == "" || true', device_indexes=[0])
@example(expression=f'cidr("10.0.0.0/8").containsIP({FAILS}) || true', device_indexes=[0])
@example(expression=f'cidr("10.0.0.0/8").containsCIDR({FAILS}) || true', device_indexes=[0])
@example(expression='cidr("::/128").containsIP(dyn("::1")) || true', device_indexes=[0])
@example(expression=f"[1, 2].slice(0, {FAILS}.size()) == [] || true", device_indexes=[0])
@example(expression="[1, 2].slice(0, 5) == [] || true", device_indexes=[0])
@example(expression=f"lists.range({FAILS}.size()) == [] || true", device_indexes=[0])
# sort's cost tracker is registered per overload id: a call on dyn elements costs one unit.
@example(expression=f"[{NAME}, {NAME}].sort() == [] || true", device_indexes=[0])
# A map literal takes keys of any type, each type apart (Go map); a double finds an int or uint key.
@example(expression="{dyn(1.0): 1}[dyn(1.0)] == 1", device_indexes=[0])
@example(expression="dyn(1.0) in {dyn(1.0): 1}", device_indexes=[0])
@example(expression="{dyn(1.0): 1}.size() == 1", device_indexes=[0])
@example(expression="{dyn(1.0): 1, dyn(1): 2}.size() == 2", device_indexes=[0])
@example(expression="{dyn(1.0): 1, dyn(1): 2}[1] == 2", device_indexes=[0])
@example(expression="{dyn(1.0): 1}[1] == 1 || true", device_indexes=[0])
@example(expression="{dyn(1): 1}[dyn(2u)] == 1", device_indexes=[0])
@example(expression="{dyn(true): 1, dyn(1): 2, dyn(1u): 3}.size() == 3", device_indexes=[0])
@example(expression="{dyn(1.0): 1} == {1: 1} && {1: 1} != {dyn(1.0): 1}", device_indexes=[0])
@example(expression="has({1: 1}.x)", device_indexes=[0])
# ext lists' cost trackers assert a list (or an int) on an error argument: a Go panic, which
# no operator absorbs, and the call is not charged.
@example(expression=f"0 in [{ATTRS}computeMajor, {ATTRS}parentMinor].distinct()", device_indexes=[0])
@example(expression=f"[{FAILS}].sort() == [] || true", device_indexes=[0])
@example(expression=f"[3, 1].sortBy(x, {FAILS}.size()) == [] || true", device_indexes=[0])
@example(expression=f"[[1]].flatten({FAILS}.size()) == [] || true", device_indexes=[0])
@example(expression=f"[1].exists(x, [{FAILS}].distinct() == [])", device_indexes=[0])
@example(expression=f"dyn({FAILS}).sort() == [] || true", device_indexes=[0])
@example(expression=f"[{FAILS}].reverse() == [] || true", device_indexes=[0])
# has() over a chain is one attribute: a qualifier before the test that fails ends the charges.
@example(expression=f"has({ATTRS}productName.x.y) || true", device_indexes=[0])
@example(expression=f"has({ATTRS}productName.x.y.z) || true", device_indexes=[0])
@example(expression=f"has({ATTRS}x.y) || true", device_indexes=[0])
@example(expression=f'has({ATTRS}productName["x"].y) || true', device_indexes=[0])
@example(expression=f"has(dyn({ATTRS}productName).x.y) || true", device_indexes=[0])
@example(expression="has(device.attributes.x.y.z) || true", device_indexes=[0])
@example(expression=f"has({ATTRS[:-1]}[string(1/0)].x) || true", device_indexes=[0])
@example(
    expression=f'has({ATTRS[:-1]}[has({ATTRS}productName.x.y) ? "a" : "b"].x) || true', device_indexes=[0]
)
@example(expression=f"{ATTRS}productName.x.y.z == 1 || true", device_indexes=[0])
@example(expression=f'{ATTRS}productName["x"]["y"] == 1 || true', device_indexes=[0])
@example(expression=f"has(dyn({FAILS}).x.y) || true", device_indexes=[0])
@example(expression=f"has(dyn({ATTRS[:-1]})[{FAILS}].x) || true", device_indexes=[0])
@example(expression=f"has({ATTRS}productName[{ATTRS}parentMinor].x) || true", device_indexes=[0])
# A relative attribute (an index or field of a call's result) is charged when its operand fails.
@example(expression=f"[][{ATTRS}parentMinor] == 1 || true", device_indexes=[0])
@example(expression=f"[1][{FAILS}.size()] == 1 || true", device_indexes=[0])
@example(expression=f"dyn({FAILS})[0] == 1 || true", device_indexes=[0])
@example(expression=f"dyn({FAILS}).x == 1 || true", device_indexes=[0])
@example(expression=f"{ATTRS}productName[0 + {ATTRS}parentMinor] == 1 || true", device_indexes=[0])
@example(expression=f"[1][(true ? {ATTRS[:-1]} : {ATTRS[:-1]}).parentMinor] == 1 || true", device_indexes=[0])
# A constant index of a type cel-go cannot qualify with fails when the program is planned.
@example(expression='{dyn(duration("1s")): 1}[dyn(duration("1s"))] == 1', device_indexes=[0])
@example(expression="{dyn(null): 1}[dyn(null)] == 1", device_indexes=[0])
@example(expression="[1][dyn(null)] == 1", device_indexes=[0])
@example(expression="{null: 1}[null] == 1", device_indexes=[0])
@example(
    expression='{timestamp("2020-01-01T00:00:00Z"): 1}[timestamp("2020-01-01T00:00:00Z")] == 1',
    device_indexes=[0],
)
@example(expression='[1][dyn(bytes("a"))] == 1', device_indexes=[0])
@example(expression="[1][dyn([1])] == 1 || true", device_indexes=[0])
@example(expression="[1][dyn({1: 2})] == 1", device_indexes=[0])
@example(expression="[1][dyn({[1]: 2})] == 1", device_indexes=[0])
@example(expression="[1][dyn(int)] == 1", device_indexes=[0])
@example(expression="[1][?dyn(null)] == optional.of(1)", device_indexes=[0])
@example(expression="false && [1][dyn(null)] == 1", device_indexes=[0])
# A key computed at run time of a type no qualifier takes; a uint index out of bounds.
@example(expression=f"[1][dyn({ATTRS}driverVersion)] == 1", device_indexes=[0])
@example(expression='{"a": 1}[dyn(device.capacity["gpu.dradriver.dev"].memory)] == 1', device_indexes=[0])
@example(expression=f'{{"a": 1}}[?dyn({ATTRS}driverVersion)] == optional.none()', device_indexes=[0])
@example(expression="[1][dyn(optional.of(1))] == 1", device_indexes=[0])
@example(expression="[1, 2][dyn(5u)] == 1", device_indexes=[0])
# A root-scoped name that is not declared is reported as written.
@example(expression="[1][.minor] == 1", device_indexes=[0])
# A conditional cut off before ':': cel-go's visitor still builds (and reports) its first branch.
@example(expression=f'true ? has({ATTRS[:-1]}["pciBusID"])', device_indexes=[0])
@example(expression=f'(true ? has({ATTRS[:-1]}["x"])', device_indexes=[0])
@example(expression='true ? [has(a["b"])', device_indexes=[0])
@example(expression=f'true ? false ? has({ATTRS[:-1]}["x"])', device_indexes=[0])
# has() at the end of an optional chain, or of an optional operand, tests inside the optional.
@example(expression='has(device.attributes[?"gpu.dradriver.dev"].minor)', device_indexes=[0])
@example(expression='has(device.attributes[?"x"].y)', device_indexes=[0])
@example(expression='has(dyn({"a": {"c": 1}})[?"a"].b)', device_indexes=[0])
@example(expression='has({"a": {"b": 1}}.?x.b)', device_indexes=[0])
@example(expression='has(dyn(optional.of({"b": 1})).b)', device_indexes=[0])
@example(expression="has(dyn(optional.none()).b)", device_indexes=[0])
# A token that cannot continue a whole operand in a list, map or call: ANTLR expects what may
# follow the operand; a map entry's missing ':' is inserted.
@example(expression="[].all(v0, true & true)", device_indexes=[0])
@example(expression="[1, 2 3] == []", device_indexes=[0])
@example(expression="{1: 2 3: 4} == {}", device_indexes=[0])
@example(expression="{1 2} == {}", device_indexes=[0])
# ANTLR recovers after a mismatched input (drops tokens up to one that may follow a rule in
# progress) and after an inserted token, and reports what it meets later; the visitor still builds
# the partial tree (macro errors), and cel-go stops at 30 recoveries and shows 100 issues.
@example(expression=f'[].all(v0, true & device.driver == "{DRIVER}")', device_indexes=[0])
@example(expression="{1 2 3} == {}", device_indexes=[0])
@example(expression="[1, 2 3 4] == []", device_indexes=[0])
@example(expression='[].all(v0, true & true) && has(a["b"])', device_indexes=[0])
@example(expression='(true & true) || has(a["b"])', device_indexes=[0])
@example(expression='true ? [true & true] : has(a["b"])', device_indexes=[0])
@example(expression="(1 + ) && has(a[1])", device_indexes=[0])
@example(expression="'abc\n== 'a'", device_indexes=[0])
@example(expression='device.driver =[= "x"', device_indexes=[0])
@example(expression='has(device.attributes["x"].?) || true', device_indexes=[0])
@example(expression="{" + ", ".join(["1 2"] * 40) + "}", device_indexes=[0])
@example(expression="@" * 110 + "true", device_indexes=[0])
# What cel-python's grammar takes and CEL.g4 does not: ANTLR's own errors.
@example(expression="!(true || false) && -!true", device_indexes=[0])
@example(expression='device.driver.in == "x"', device_indexes=[0])
@example(expression="(x){a: 1} == 1", device_indexes=[0])
# An operand missing from ANTLR's partial tree is an empty expression without a location (1:0).
@example(expression="cel.bind(..x, 1, x + 1) == 2", device_indexes=[0])
@example(expression="has(.) || true", device_indexes=[0])
# A global call with a leading dot is named as written, at its '('; a message literal sits at its
# '{'; a sign apart from its number is still the literal's, which sits at the sign.
@example(expression=".nosuch(1) == 1", device_indexes=[0])
@example(expression="has(x{a: 1}) || true", device_indexes=[0])
@example(expression=f"- 3 == {ATTRS}minor", device_indexes=[0])
@example(expression="- 9223372036854775809 == 0", device_indexes=[0])
# CEL.g4's NUM_FLOAT needs digits after the point: `1.e5` selects a field of `1`, `0.size()` calls
# a function on `0`; `null`, like `in`, is a token of its own, never a field name.
@example(expression="1.e5 == 1", device_indexes=[0])
@example(expression="0.size() == 0", device_indexes=[0])
@example(expression="-1.e+5 == 1", device_indexes=[0])
@example(expression="1.x() == 1.e", device_indexes=[0])
@example(expression="device.null == 1", device_indexes=[0])
@example(expression="device.?null == 1", device_indexes=[0])
# kubernetes.Quantity and kubernetes.Semver are no type identifiers in the Kubernetes environment.
@example(expression='type(quantity("1")) == kubernetes.Quantity', device_indexes=[0])
# Message literals of the protobuf wrapper types are their primitive values (the zero value when
# unset), of type wrapper(T) to the checker; a field value converts to the field's Go type.
@example(expression="google.protobuf.Int64Value{vue: 1} == 1", device_indexes=[0])
@example(expression=".google.protobuf.Int64Value{value: 1} == 1", device_indexes=[0])
@example(expression="google.protobuf.Int32Value{value: 1u, ?value: 2} == 1", device_indexes=[0])
@example(expression="google.protobuf.Int32Value{value: 2147483648} == 1", device_indexes=[0])
@example(expression="google.protobuf.UInt32Value{value: 4294967296u} == 1u", device_indexes=[0])
@example(expression="google.protobuf.FloatValue{value: 1.1} == 1.1", device_indexes=[0])
@example(expression="google.protobuf.FloatValue{value: -1e39} < 1.0", device_indexes=[0])
@example(expression="google.protobuf.BoolValue{value: true}", device_indexes=[0])
@example(expression="google.protobuf.Int64Value{?value: optional.none(), } == 0", device_indexes=[0])
@example(
    expression="google.protobuf.Int64Value{,} != google.protobuf.Int64Value{?value: dyn(1)}",
    device_indexes=[0],
)
@example(expression="google.protobuf.BytesValue{value: dyn([1u, 256u])} == b''", device_indexes=[0])
@example(expression=f"google.protobuf.StringValue{{value: dyn({NAME})}} == {NAME}", device_indexes=[0])
@example(expression=f"google.protobuf.Int64Value{{value: dyn({NAME})}} == 1 || true", device_indexes=[0])
@example(expression="google.protobuf.DoubleValue{value: dyn(optional.of(1))} == 1.0", device_indexes=[0])
@example(expression="google.protobuf.UInt64Value{value: dyn(optional.none())} == 1u", device_indexes=[0])
@example(expression="google.protobuf.StringValue{value: dyn(semver('1.0.0'))} == '1.0.0'", device_indexes=[0])
@example(expression="google.protobuf.Int64Value{value: dyn(duration('1s'))} == 1", device_indexes=[0])
@example(expression="null == google.protobuf.Int64Value{value: 1}", device_indexes=[0])
@example(expression="(true ? google.protobuf.Int64Value{} : null) == 0", device_indexes=[0])
@example(expression="[google.protobuf.Int64Value{}, null].size() == 1", device_indexes=[0])
@example(expression="{'a': google.protobuf.Int64Value{}}['a'] == 0", device_indexes=[0])
@example(expression="google.protobuf.Int64Value{value: 1}.value == 1", device_indexes=[0])
@example(expression="google.protobuf.Int64Value{value: 1} == 1.0", device_indexes=[0])
@example(expression="google.protobuf.UInt32Value == uint", device_indexes=[0])
# A message literal of a name that is no message type, or no type.
@example(expression="int{a: y} == 1", device_indexes=[0])
@example(expression="net.IP{a: 1} == 1 || map{a: 1} == 1", device_indexes=[0])
@example(expression="device{} == 1", device_indexes=[0])
@example(expression="null_type{} == null", device_indexes=[0])
@example(expression="x{a: y} == 1", device_indexes=[0])
# Timestamp and Duration literals: nanoseconds carry into the seconds; a Duration saturates.
@example(
    expression="google.protobuf.Timestamp{seconds: 1, nanos: -1} < timestamp('1970-01-01T00:00:01Z')",
    device_indexes=[0],
)
@example(
    expression="google.protobuf.Timestamp{nanos: 3000000000} == timestamp('1970-01-01T00:00:01Z')",
    device_indexes=[0],
)
@example(
    expression="google.protobuf.Timestamp{seconds: dyn(1u)} == timestamp('1970-01-01T00:00:01Z')",
    device_indexes=[0],
)
@example(expression="google.protobuf.Duration{seconds: 9223372037} > duration('1s')", device_indexes=[0])
@example(
    expression="google.protobuf.Duration{seconds: -1, nanos: 1} == duration('-999999999ns')",
    device_indexes=[0],
)
@example(expression="google.protobuf.Duration{a: 1} == duration('1s')", device_indexes=[0])
# A Timestamp's seconds since year 1 wrap near int64's maximum, as Go's time.Time's do.
@example(
    expression="google.protobuf.Timestamp{seconds: 9223372036854775807} > timestamp('2000-01-01T00:00:00Z')",
    device_indexes=[0],
)
@example(
    expression=(
        "google.protobuf.Timestamp{seconds: 9223372036854775807 - 62135596800} > "
        "timestamp('2000-01-01T00:00:00Z')"
    ),
    device_indexes=[0],
)
# A quantity converts to a string in its canonical form, in the format it was parsed with (a
# canonical-looking input as written).
@example(expression="google.protobuf.StringValue{value: dyn(quantity('1000'))} == '1k'", device_indexes=[0])
@example(
    expression=(
        "[quantity('1Ki'), quantity('1.5Gi'), quantity('0.1'), quantity('1E3'), quantity('+5'), "
        "quantity('0.5Ki'), quantity('1.5e-3'), quantity('1000000000000000000000')]"
        ".map(q, google.protobuf.StringValue{value: dyn(q)}) == "
        "['1Ki', '1536Mi', '100m', '1E3', '+5', '512', '1500e-6', '1']"
    ),
    device_indexes=[0],
)
@example(
    expression=(
        "[quantity('1k').add(quantity('1Ki')), quantity('0').sub(quantity('2Ki')), quantity('1Ki').add(1024)]"
        ".map(q, google.protobuf.StringValue{value: dyn(q)}) == ['2024', '-2Ki', '2Ki']"
    ),
    device_indexes=[0],
)
# Escaped (backquoted) names are off in Kubernetes: reported at the backquote, or where a message
# literal's fields start (whose value then goes unvisited).
@example(expression="x.`a` && has(y.`b`)", device_indexes=[0])
@example(expression="T{a: x.`g`, `h`: y.`i`, ?`j`: z}", device_indexes=[0])
@example(expression="device.attributes.?`dradriver.dev`", device_indexes=[0])
@example(expression="x.`a`)", device_indexes=[0])
# The other well-known types: Empty is a message, Struct, ListValue and Value are JSON values, Any
# unpacks what it packs, NullValue.NULL_VALUE is 0.
@example(expression="google.protobuf.Empty{} == google.protobuf.Empty{}", device_indexes=[0])
@example(expression="type(google.protobuf.Empty{}) == google.protobuf.Empty", device_indexes=[0])
@example(expression="google.protobuf.Empty{}.a == 1", device_indexes=[0])
@example(expression="google.protobuf.Struct == map", device_indexes=[0])
@example(
    expression=(
        "google.protobuf.Struct{fields: {'a': dyn(9007199254740993), 'b': dyn(b'ab'), "
        "'c': dyn(duration('1s')), 'd': dyn(google.protobuf.Empty{})}} == "
        "{'a': dyn('9007199254740993'), 'b': dyn('YWI='), 'c': dyn('1s'), 'd': dyn({})}"
    ),
    device_indexes=[0],
)
@example(expression="google.protobuf.Struct{fields: dyn({1: 1})} == {}", device_indexes=[0])
@example(expression="google.protobuf.Struct{fields: {'a': quantity('1')}} == {}", device_indexes=[0])
@example(expression="google.protobuf.ListValue{values: dyn('x')} == []", device_indexes=[0])
@example(
    expression="google.protobuf.ListValue{values: [1, optional.of(2u)]} == [1.0, 2.0]", device_indexes=[0]
)
@example(
    expression=(
        "google.protobuf.Value{} == null && google.protobuf.Value{string_value: dyn(quantity('1k'))} == '1k'"
    ),
    device_indexes=[0],
)
@example(expression="google.protobuf.Value{number_value: 1}", device_indexes=[0])
@example(expression="google.protobuf.Value{list_value: dyn({'values': [1]})} == [1.0]", device_indexes=[0])
@example(expression="google.protobuf.Value{null_value: 5000000000} == null", device_indexes=[0])
@example(expression="google.protobuf.NullValue.NULL_VALUE + 1 == 1", device_indexes=[0])
@example(expression="has(google.protobuf.NullValue.NULL_VALUE)", device_indexes=[0])
@example(expression="google.protobuf.Any{} == 1", device_indexes=[0])
@example(
    expression=(
        r"google.protobuf.Any{type_url: 'x/google.protobuf.Int64Value', value: b'\x08\xff\x01'}"
        " == 255"
    ),
    device_indexes=[0],
)
@example(
    expression=r"google.protobuf.Any{type_url: 'x\"y', value: b'\x0b\x08\x01\x0c\xff'} == 0",
    device_indexes=[0],
)
@example(
    expression=(
        r"google.protobuf.Any{type_url: 'x/google.protobuf.Empty', value: b'\x08\x01\x10\x01'} == "
        r"google.protobuf.Any{type_url: 'x/google.protobuf.Empty', value: b'\x10\x01\x08\x01'}"
    ),
    device_indexes=[0],
)
@example(
    expression=(
        "google.protobuf.Any{type_url: 'x/google.protobuf.Struct', "
        r"value: b'\x0a\x0a\x0a\x01a\x12\x05\x1a\x03abc'} == {'a': 'abc'}"
    ),
    device_indexes=[0],
)
@example(expression="{'a': 1, 'b': b'ab', 'c': duration('1s')} == {}", device_indexes=[0])
@example(expression="{1: 1, 'a': 'b', 2.0: 3.0} == {}", device_indexes=[0])
@example(expression="{1: 1, 2: 'b', 'a': 3.0} == {}", device_indexes=[0])
@example(expression="[1, 'x', string(1)] == []", device_indexes=[0])
def test_generated_selectors_agree_with_kubernetes(
    cel_oracle: Oracle, expression: str, device_indexes: list[int]
) -> None:
    check(cel_oracle, expression, device_indexes)
