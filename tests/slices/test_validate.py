"""The validator reports each upstream rule, at the right path, and never raises on bad shapes."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest

from dradriver.slices import Finding, build_node_slices, validate_slice, validate_slices
from tests.helpers import write_gpu_profile

DRIVER = "gpu.dradriver.dev"
Slices = list[dict[str, Any]]


@pytest.fixture(scope="module")
def static() -> Slices:
    return build_node_slices("dgx-a100-mig", node_name="node-a", driver_name=DRIVER)


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Slices:
    """Six H100s in MIG mode without MIG devices: 150 placements and six counter sets."""
    profile = write_gpu_profile(tmp_path_factory.mktemp("profile") / "mig.yaml", 6, mig_empty=True)
    return build_node_slices(str(profile), node_name="node-a", driver_name=DRIVER, partitionable=True)


def _device(slices: Slices, index: int = 0) -> dict[str, Any]:
    device: dict[str, Any] = slices[0]["spec"]["devices"][index]
    return device


def _attrs(slices: Slices) -> dict[str, Any]:
    attributes: dict[str, Any] = _device(slices)["attributes"]
    return attributes


def _set_version(s: Slices, value: str) -> None:
    _attrs(s)["driverVersion"] = {"version": value}


STATIC_CASES: list[tuple[str, Callable[[Slices], None], str, str]] = [
    ("device name", lambda s: _device(s).update(name="GPU_0"), "[0].spec.devices[0].name", "RFC 1123 label"),
    (
        "device name long",
        lambda s: _device(s).update(name="g" * 64),
        "[0].spec.devices[0].name",
        "no more than 63",
    ),
    (
        "attribute name with a dot",
        lambda s: _attrs(s).update({"compute.major": {"int": 9}}),
        "[0].spec.devices[0].attributes[compute.major]",
        "C identifier",
    ),
    (
        "attribute name with two slashes",
        lambda s: _attrs(s).update({"a.b/c/d": {"int": 9}}),
        "[0].spec.devices[0].attributes[a.b/c/d]",
        "more than one slash",
    ),
    (
        "attribute name too long",
        lambda s: _attrs(s).update({"x" * 33: {"int": 9}}),
        f"[0].spec.devices[0].attributes.{'x' * 33}",
        "no more than 32",
    ),
    (
        "string over 64 bytes",
        lambda s: _attrs(s).update(productName={"string": "é" * 33}),
        "[0].spec.devices[0].attributes.productName.string",
        "64 bytes",
    ),
    ("two-part version", lambda s: _set_version(s, "8.6"), ".attributes.driverVersion.version", "semver"),
    ("leading zero", lambda s: _set_version(s, "535.104.05"), ".attributes.driverVersion.version", "semver"),
    ("v prefix", lambda s: _set_version(s, "v1.2.3"), ".attributes.driverVersion.version", "semver"),
    (
        "two values",
        lambda s: _attrs(s).update(type={"string": "gpu", "int": 1}),
        "[0].spec.devices[0].attributes.type",
        "exactly one value",
    ),
    (
        "no value",
        lambda s: _attrs(s).update(type={}),
        "[0].spec.devices[0].attributes.type",
        "exactly one value",
    ),
    (
        "bool as int",
        lambda s: _attrs(s).update(minor={"int": True}),
        ".attributes.minor.int",
        "64-bit integer",
    ),
    (
        "int64 overflow",
        lambda s: _attrs(s).update(minor={"int": 2**63}),
        ".attributes.minor.int",
        "64-bit integer",
    ),
    (
        "empty list value",
        lambda s: _attrs(s).update(tags={"strings": []}),
        ".attributes.tags.strings",
        "not be empty",
    ),
    (
        "33 attributes and capacities",
        lambda s: _attrs(s).update({f"extra{i}": {"int": i} for i in range(32 - 25 + 1)}),
        "[0].spec.devices[0]",
        "must not exceed 32",
    ),
    (
        "quantity as a number",
        lambda s: _device(s)["capacity"].update(memory={"value": 1024}),
        "[0].spec.devices[0].capacity.memory.value",
        "quantity string",
    ),
    (
        "malformed quantity",
        lambda s: _device(s)["capacity"].update(memory={"value": "80GB"}),
        "[0].spec.devices[0].capacity.memory.value",
        "regular expression",
    ),
    (
        "request policy without multiple allocations",
        lambda s: _device(s)["capacity"]["memory"].update(requestPolicy={"default": "1Gi"}),
        "[0].spec.devices[0].capacity.memory.requestPolicy",
        "allowMultipleAllocations must be true",
    ),
    (
        "unknown device field",
        lambda s: _device(s).update(basic={}),
        "[0].spec.devices[0].basic",
        "unknown field",
    ),
    (
        "taint effect",
        lambda s: _device(s).update(taints=[{"key": "a", "effect": "Evict"}]),
        ".taints[0].effect",
        "NoSchedule",
    ),
    (
        "taint key",
        lambda s: _device(s).update(taints=[{"key": "-a", "effect": "NoSchedule"}]),
        ".taints[0].key",
        "name part",
    ),
    (
        "17 taints",
        lambda s: _device(s).update(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]),
        "[0].spec.devices[0].taints",
        "at most 16",
    ),
    (
        "binding conditions without failure conditions",
        lambda s: _device(s).update(bindingConditions=["ready"]),
        "[0].spec.devices[0]",
        "must be set together",
    ),
    (
        "per-device node name without perDeviceNodeSelection",
        lambda s: _device(s).update(nodeName="node-a"),
        "[0].spec.devices[0]",
        "can only be set if `perDeviceNodeSelection`",
    ),
    (
        "duplicate device in slice",
        lambda s: s[0]["spec"]["devices"].append(copy.deepcopy(_device(s))),
        "[0].spec.devices[28]",
        "Duplicate value",
    ),
    (
        "129 devices",
        lambda s: s[0]["spec"]["devices"].extend(
            {**copy.deepcopy(_device(s)), "name": f"extra-{i}"} for i in range(101)
        ),
        "[0].spec.devices",
        "at most 128",
    ),
    ("no node selection", lambda s: s[0]["spec"].pop("nodeName"), "[0].spec", "exactly one of `nodeName`"),
    (
        "two node selections",
        lambda s: s[0]["spec"].update(allNodes=True),
        "[0].spec",
        "multiple fields are set",
    ),
    (
        "allNodes false",
        lambda s: s[0]["spec"].update(allNodes=False),
        "[0].spec.allNodes",
        "unset or set to true",
    ),
    ("empty node name", lambda s: s[0]["spec"].update(nodeName=""), "[0].spec.nodeName", "non-empty"),
    (
        "bad node name",
        lambda s: s[0]["spec"].update(nodeName="Node_A"),
        "[0].spec.nodeName",
        "RFC 1123 subdomain",
    ),
    (
        "node selector with two terms",
        lambda s: s[0]["spec"].update(nodeName=None, nodeSelector={"nodeSelectorTerms": [{}, {}]}),
        "[0].spec.nodeSelector.nodeSelectorTerms",
        "exactly one node selector term",
    ),
    (
        "uppercase driver",
        lambda s: s[0]["spec"].update(driver="GPU.example.com"),
        "[0].spec.driver",
        "lowercase",
    ),
    ("long driver", lambda s: s[0]["spec"].update(driver="a" * 64), "[0].spec.driver", "no more than 63"),
    ("bad pool name", lambda s: s[0]["spec"]["pool"].update(name="a//b"), "[0].spec.pool.name", "subdomain"),
    (
        "negative generation",
        lambda s: s[0]["spec"]["pool"].update(generation=-1),
        "[0].spec.pool.generation",
        "greater than or equal",
    ),
    (
        "zero slice count",
        lambda s: s[0]["spec"]["pool"].update(resourceSliceCount=0),
        "[0].spec.pool.resourceSliceCount",
        "greater than zero",
    ),
    (
        "incomplete pool",
        lambda s: s[0]["spec"]["pool"].update(resourceSliceCount=2),
        "[0].spec.pool.resourceSliceCount",
        "incomplete",
    ),
    (
        "wrong apiVersion",
        lambda s: s[0].update(apiVersion="resource.k8s.io/v1beta1"),
        "[0].apiVersion",
        "must be",
    ),
    ("wrong kind", lambda s: s[0].update(kind="DeviceClass"), "[0].kind", "must be ResourceSlice"),
    ("no name", lambda s: s[0].update(metadata={}), "[0].metadata.name", "generateName is required"),
    (
        "bad generateName",
        lambda s: s[0]["metadata"].update(generateName="-x-"),
        "[0].metadata.generateName",
        "RFC 1123",
    ),
    (
        "unknown spec field",
        lambda s: s[0]["spec"].update(partitionType="x"),
        "[0].spec.partitionType",
        "unknown",
    ),
    (
        "1.36's name of the node-allocatable field",
        lambda s: _device(s).update(nodeAllocatableResourceMappings={}),
        "[0].spec.devices[0].nodeAllocatableResourceMappings",
        "unknown field",
    ),
    (
        "partition type attribute without a domain",
        lambda s: s[0]["spec"].update(partitionTypeAttribute="profile"),
        "[0].spec.partitionTypeAttribute",
        "domain and a name separated by a slash",
    ),
    (
        "unknown node operation",
        lambda s: s[0]["spec"].update(skipNodeOperations=["NodeUnprepareResources", "Reboot"]),
        "[0].spec.skipNodeOperations[1]",
        'supported values: "*", "NodePrepareResources", "NodeUnprepareResources"',
    ),
    (
        "skipping prepare but not unprepare",
        lambda s: s[0]["spec"].update(skipNodeOperations=["NodePrepareResources"]),
        "[0].spec.skipNodeOperations",
        'requires "NodeUnprepareResources"',
    ),
    (
        "repeated node operation",
        lambda s: s[0]["spec"].update(skipNodeOperations=["*", "*"]),
        "[0].spec.skipNodeOperations[1]",
        "Duplicate value",
    ),
    (
        "bare and qualified twin",
        lambda s: _attrs(s).update({f"{DRIVER}/uuid": {"string": "x"}}),
        f"[0].spec.devices[0].attributes[{DRIVER}/uuid]",
        "same CEL key",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path", "message"), [c[1:] for c in STATIC_CASES], ids=[c[0] for c in STATIC_CASES]
)
def test_static_rules(static: Slices, mutate: Callable[[Slices], None], path: str, message: str) -> None:
    slices = copy.deepcopy(static)
    mutate(slices)
    findings = validate_slices(slices)
    assert any(f.path.endswith(path) and message in f.message for f in findings), findings


def _counter_slice(s: Slices) -> dict[str, Any]:
    spec: dict[str, Any] = s[-1]["spec"]
    return spec


def _consumption(s: Slices) -> dict[str, Any]:
    consumption: dict[str, Any] = _device(s)["consumesCounters"][0]
    return consumption


COUNTER_CASES: list[tuple[str, Callable[[Slices], None], str, str]] = [
    (
        "65 devices with counters",
        lambda s: s[0]["spec"]["devices"].append({**copy.deepcopy(_device(s, 1)), "name": "extra"}),
        "[0].spec.devices",
        "at most 64 items when devices use taints, counters",
    ),
    (
        "devices and counters in one slice",
        lambda s: s[0]["spec"].update(sharedCounters=_counter_slice(s)["sharedCounters"]),
        "[0].spec",
        "only one of `sharedCounters` or `devices`",
    ),
    (
        "unknown counter set",
        lambda s: _consumption(s).update(counterSet="gpu-9-counters"),
        "[0].spec.devices[0].consumesCounters[0].counterSet",
        "not in pool",
    ),
    (
        "unknown counter",
        lambda s: _consumption(s)["counters"].update({"tensor-cores": {"value": "1"}}),
        "[0].spec.devices[0].consumesCounters[0].counters[tensor-cores]",
        "not in counter set",
    ),
    (
        "three consumptions",
        lambda s: _device(s).update(consumesCounters=[_consumption(s)] * 3),
        "[0].spec.devices[0].consumesCounters",
        "at most 2",
    ),
    (
        "counter name not a DNS label",
        lambda s: _counter_slice(s)["sharedCounters"][0]["counters"].update({"copyEngines": {"value": "1"}}),
        "[3].spec.sharedCounters[0].counters.copyEngines",
        "RFC 1123 label",
    ),
    (
        "33 counters",
        lambda s: _counter_slice(s)["sharedCounters"][0]["counters"].update(
            {f"c{i}": {"value": "1"} for i in range(20)}
        ),
        "[3].spec.sharedCounters[0].counters",
        "at most 32",
    ),
    (
        "no counters",
        lambda s: _counter_slice(s)["sharedCounters"][0].update(counters={}),
        "[3].spec.sharedCounters[0].counters",
        "at least one counter",
    ),
    (
        "9 counter sets",
        lambda s: _counter_slice(s)["sharedCounters"].extend(
            {"name": f"extra-{i}", "counters": {"a": {"value": "1"}}} for i in range(3)
        ),
        "[3].spec.sharedCounters",
        "at most 8",
    ),
    (
        "duplicate counter set",
        lambda s: _counter_slice(s)["sharedCounters"].append(
            copy.deepcopy(_counter_slice(s)["sharedCounters"][0])
        ),
        "[3].spec.sharedCounters[6]",
        "Duplicate value",
    ),
    (
        "device name repeated across slices",
        lambda s: s[1]["spec"]["devices"][0].update(name=_device(s)["name"]),
        "[1].spec.devices[0]",
        "repeats in pool",
    ),
    (
        "mixed generations",
        lambda s: s[1]["spec"]["pool"].update(generation=2),
        "[0].spec.pool.generation",
        "mixes generations",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path", "message"), [c[1:] for c in COUNTER_CASES], ids=[c[0] for c in COUNTER_CASES]
)
def test_counter_rules(
    partitioned: Slices, mutate: Callable[[Slices], None], path: str, message: str
) -> None:
    slices = copy.deepcopy(partitioned)
    mutate(slices)
    findings = validate_slices(slices)
    assert any(f.path == path and message in f.message for f in findings), findings


def _with_policy(slices: Slices, policy: dict[str, Any]) -> None:
    device = _device(slices)
    device["allowMultipleAllocations"] = True
    device["capacity"]["memory"] = {"value": "40Gi", "requestPolicy": policy}


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"default": "1Gi", "validValues": ["1Gi", "2Gi"]}, None),
        ({"default": "1Gi", "validRange": {"min": "1Gi", "max": "40Gi", "step": "1Gi"}}, None),
        ({"default": "3Gi", "validValues": ["1Gi", "2Gi"]}, "default value is not valid"),
        ({"default": "1Gi", "validValues": ["2Gi", "1Gi"]}, "ascending"),
        ({"default": "1Gi", "validValues": ["1Gi", "80Gi"]}, "larger than capacity"),
        ({"validValues": ["1Gi"]}, "required when validValues or validRange"),
        ({"default": "1Gi", "validValues": ["1Gi"], "validRange": {"min": "1Gi"}}, "exactly one policy"),
        ({"default": "1Gi", "validRange": {"max": "2Gi"}}, "min: required"),
        ({"default": "1Gi", "validRange": {"min": "2Gi"}}, "default is less than min"),
        ({"default": "3Gi", "validRange": {"min": "1Gi", "step": "2Gi", "max": "39Gi"}}, None),
        (
            {"default": "2Gi", "validRange": {"min": "1Gi", "step": "2Gi"}},
            "default is not a multiple of step",
        ),
        ({"default": "1Gi", "validRange": {"min": "1Gi", "step": "0"}}, "greater than zero"),
        ({"default": "1Gi", "validRange": {"min": "1Gi", "max": "41Gi"}}, "max is larger than capacity"),
    ],
)
def test_request_policy_rules(static: Slices, policy: dict[str, Any], message: str | None) -> None:
    slices = copy.deepcopy(static)
    _with_policy(slices, policy)
    findings = validate_slices(slices)
    if message is None:
        assert findings == []
    else:
        assert any(message in str(f) for f in findings), findings


@pytest.mark.parametrize(
    "junk",
    [None, 3, "slice", [], {"spec": []}, {"spec": {"devices": "x", "pool": "p"}},
     {"spec": {"devices": [None, 1]}}, {"spec": {"devices": [{"attributes": [], "capacity": 5}]}},
     {"spec": {"sharedCounters": [None, {"counters": 1}]}}],
)  # fmt: skip
def test_bad_shapes_are_findings_not_exceptions(junk: Any) -> None:
    findings = validate_slices([junk])
    assert findings
    assert all(isinstance(f, Finding) for f in findings)


def test_fields_new_in_137_are_accepted(static: Slices) -> None:
    slices = copy.deepcopy(static)
    slices[0]["spec"].update(
        partitionTypeAttribute=f"{DRIVER}/profile",
        skipNodeOperations=["NodePrepareResources", "NodeUnprepareResources"],
    )
    _device(slices)["nodeAllocatableResources"] = {"memory": {"overhead": {"perPod": "512Mi"}}}
    assert validate_slices(slices) == []
    kubernetes_validate.validate(slices[0], "1.37.0", strict=True)  # the shapes 1.37's API has


def test_validate_slice_on_one_object(static: Slices) -> None:
    assert validate_slice(static[0]) == []
    broken = copy.deepcopy(static[0])
    broken["spec"]["devices"][3]["attributes"]["productName"] = {"string": "x" * 65}
    assert validate_slice(broken) == [
        Finding(".spec.devices[3].attributes.productName.string", "may not be more than 64 bytes")
    ]
    assert (
        str(validate_slices([broken])[0])
        == "[0].spec.devices[3].attributes.productName.string: may not be more than 64 bytes"
    )
