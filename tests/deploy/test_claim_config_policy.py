"""The optional admission policy on ResourceClaims (deploy/components/claim-config-policy): its
CEL compiles, passes the configs we document and refuses what the plugin refuses, evaluated
with the project's port of the Kubernetes CEL environment (a real API server runs it in
tests/e2e/test_admission.py)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dradriver.offline.cel import types as t
from dradriver.offline.cel.checker import STRUCT_FIELDS, Checker
from dradriver.offline.cel.decls import declarations
from dradriver.offline.cel.parser import parse
from dradriver.offline.cel.program import Activation, Compiler, Eval
from dradriver.prepare import config
from tests.deploy.manifests import REPO

POLICY = REPO / "deploy/components/claim-config-policy/claim-config-policy.yaml"
DRIVER = "gpu.dradriver.dev"
#: The API server's runtime budget of one expression (celconfig.PerCallLimit).
PER_CALL_LIMIT = 1_000_000


class Program:
    """One policy expression, type-checked with its variables as dyn, as the API server does
    for the fields of a RawExtension."""

    def __init__(self, expression: str, names: list[str]) -> None:
        root = parse(expression)
        checker = Checker(declarations(), dict.fromkeys(names, t.DYN), STRUCT_FIELDS)
        checked = checker.check(root)
        assert not checker.errors, (expression, checker.errors)
        compiler = Compiler(checked, {name: i for i, name in enumerate(names)})
        self._program: Eval = compiler.compile(root)
        self._slots = compiler.slot_count

    def __call__(self, *values: Any) -> Any:
        activation = Activation(self._slots, PER_CALL_LIMIT)
        activation.slots[: len(values)] = values
        return self._program(activation)


def policy() -> tuple[Program, list[tuple[Program, str]]]:
    spec = next(yaml.safe_load_all(POLICY.read_text()))["spec"]
    [variable] = spec["variables"]
    assert variable["name"] == "configs"
    validations = [(Program(v["expression"], ["variables"]), v["message"]) for v in spec["validations"]]
    return Program(variable["expression"], ["object"]), validations


CONFIGS, VALIDATIONS = policy()


def refusals(parameters: Any) -> list[str]:
    """The messages the policy answers a claim with this config (none: admitted)."""
    claim = {"spec": {"devices": {"config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}]}}}
    configs = CONFIGS(claim)
    return [message for program, message in VALIDATIONS if program({"configs": configs}) is not True]


def gpu(**sharing: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{DRIVER}/v1alpha1",
        "kind": "GpuConfig",
        **({"sharing": sharing} if sharing else {}),
    }


def mps(**settings: Any) -> dict[str, Any]:
    return gpu(strategy="MPS", mps=settings)


ADMITTED = [
    gpu(),
    gpu(strategy="TimeSlicing", timeSlicing={"interval": "Long"}),
    mps(defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="10Gi"),
    mps(perDevicePinnedMemoryLimit={"gpu-0": "20Gi", "GPU-4d6f5a7e-0000-0000-0000-000000000000": "1.5e9"}),
    {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}},
]

REFUSED = {
    "api version": ({**gpu(), "apiVersion": "v1"}, "apiVersion"),
    "kind": ({**gpu(), "kind": "GPUConfig"}, "kind must be"),
    "unknown field": ({**gpu(), "extra": 1}, "unknown field"),
    "strategy": (gpu(strategy="Exclusive"), "sharing.strategy"),
    "mixed settings": (gpu(strategy="TimeSlicing", mps={}), "sharing.strategy"),
    "mig time slicing": (
        {
            "apiVersion": f"{DRIVER}/v1alpha1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing"},
        },
        "sharing.strategy",
    ),
    "interval": (gpu(strategy="TimeSlicing", timeSlicing={"interval": "Forever"}), "interval"),
    "percentage": (mps(defaultActiveThreadPercentage=0), "defaultActiveThreadPercentage"),
    "not a quantity": (mps(defaultPinnedDeviceMemoryLimit="ten gigs"), "defaultPinnedDeviceMemoryLimit"),
    "sub-nano exponent": (mps(defaultPinnedDeviceMemoryLimit="1e-9999999"), "defaultPinnedDeviceMemoryLimit"),
    "largest exponent": (
        mps(defaultPinnedDeviceMemoryLimit="1e2147483647"),
        "defaultPinnedDeviceMemoryLimit",
    ),
    "huge mantissa": (mps(defaultPinnedDeviceMemoryLimit="9" * 5000), "defaultPinnedDeviceMemoryLimit"),
    # Not 9Ei: binary quantities are clamped to int64, by Kubernetes and by us.
    "too large": (mps(defaultPinnedDeviceMemoryLimit="1e19"), "defaultPinnedDeviceMemoryLimit"),
    "zero": (mps(defaultPinnedDeviceMemoryLimit="0"), "defaultPinnedDeviceMemoryLimit"),
    "negative": (mps(defaultPinnedDeviceMemoryLimit="-1Gi"), "defaultPinnedDeviceMemoryLimit"),
    "per device": (mps(perDevicePinnedMemoryLimit={"gpu-0": "1e-2147483648"}), "perDevicePinnedMemoryLimit"),
    "many devices": (
        mps(perDevicePinnedMemoryLimit={f"gpu-{i}": "1Gi" for i in range(1025)}),
        "perDevicePinnedMemoryLimit",
    ),
    "long device name": (mps(perDevicePinnedMemoryLimit={"g" * 254: "1Gi"}), "perDevicePinnedMemoryLimit"),
}


@pytest.mark.parametrize("parameters", ADMITTED)
def test_documented_configs_are_admitted(parameters: dict[str, Any]) -> None:
    assert config.problems(parameters) == []
    assert refusals(parameters) == []


@pytest.mark.parametrize(("parameters", "field"), REFUSED.values(), ids=REFUSED.keys())
def test_malformed_configs_are_refused_naming_the_field(parameters: dict[str, Any], field: str) -> None:
    found = refusals(parameters)
    assert found, parameters
    assert any(field in message for message in found), found
    # What the policy refuses the plugin refuses too, but for what its pattern alone refuses.
    assert config.problems(parameters) != [] or parameters == REFUSED["sub-nano exponent"][0]


def test_configs_of_other_drivers_are_not_ours_to_check() -> None:
    claim = {
        "spec": {"devices": {"config": [{"opaque": {"driver": "other.example.com", "parameters": [1]}}]}}
    }
    assert CONFIGS(claim) == ()
    assert CONFIGS({"spec": {"devices": {}}}) == ()
