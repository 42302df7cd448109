"""API-server validation of DeviceClasses, ResourceClaims and ResourceClaimTemplates, as pure checks.

Mirrors kubernetes pkg/apis/resource/validation/validation.go (validateDeviceClaim,
validateDeviceRequest, validateSelector, validateDeviceConstraint, validateOpaqueConfiguration)
with the limits of k8s.io/api resource/v1 types.go, and reports in the API server's wording
(`spec.devices.requests[0].exactly.count: Invalid value: 0: must be greater than zero`).
CEL selectors are compiled with `dradriver.offline.cel`, which rejects what the API server rejects, with
the same message, including selectors whose estimated cost exceeds the limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.names import (
    dns_label_error,
    dns_subdomain_error,
    driver_name_error,
    fully_qualified_name_error,
    int64_error,
)
from dradriver.offline.allocation.model import API_VERSIONS, RESOURCE_GROUP
from dradriver.offline.cel import COST_LIMIT, CELCompileError, compile_selector, hints_for
from dradriver.offline.cel.values import go_quote

DEVICE_REQUESTS_MAX = 32  # DeviceRequestsMaxSize = AllocationResultsMaxSize
DEVICE_SELECTORS_MAX = 32
FIRST_AVAILABLE_MAX = 8
DEVICE_CONSTRAINTS_MAX = 32
DEVICE_CONFIG_MAX = 32
DEVICE_TOLERATIONS_MAX = 16
OPAQUE_PARAMETERS_MAX = 10 * 1024
CEL_EXPRESSION_MAX = 10 * 1024
TOLERATION_EFFECTS = ("NoSchedule", "NoExecute", "None")
_REQUEST_REF_DETAIL = (
    "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"
)


@dataclass(frozen=True)
class Finding:
    """One problem: the field path inside the object and what is wrong with it (in the API
    server's words); `hints` are dradriver's suggestions for fixing it."""

    path: str
    message: str
    hints: tuple[str, ...] = ()


def opaque_config_findings(driver: str, parameters: Any, path: str) -> list[Finding]:
    """Opaque config parameters addressed to our own driver, decoded by the models prepare uses,
    so `validate` rejects exactly what NodePrepareResources would."""
    del driver
    from dradriver.prepare.config import problems

    return [Finding(field, message) for field, message in problems(parameters, path)]


def _json(value: Any) -> str:
    """A bad value as field.Error prints it: strings Go-quoted (%q), other scalars as %v."""
    if isinstance(value, str):
        return go_quote(value)
    return json.dumps(value)


class _Checker:
    def __init__(self, driver: str, list_type_attributes: bool = False) -> None:
        self.driver = driver
        self.list_type_attributes = list_type_attributes
        self.findings: list[Finding] = []

    def add(self, path: str, message: str, hints: tuple[str, ...] = ()) -> None:
        self.findings.append(Finding(path, message, hints))

    def required(self, path: str, detail: str = "") -> None:
        self.add(path, "Required value" + (f": {detail}" if detail else ""))

    def invalid(self, path: str, value: Any, detail: str, hints: tuple[str, ...] = ()) -> None:
        self.add(path, f"Invalid value: {_json(value)}: {detail}", hints)

    def too_many(self, path: str, items: list[Any], limit: int) -> bool:
        if len(items) > limit:
            self.add(path, f"Too many: {len(items)}: must have at most {limit} items")
            return True
        return False

    def object(self, value: Any, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.invalid(path, value, "must be an object")
            return {}
        return value

    def list(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.invalid(path, value, "must be a list")
            return []
        return value

    def objects(self, value: Any, path: str, limit: int) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """The path and object of each item of a list field of at most `limit` items (none when
        there are more); yielded one by one, so that each item's findings follow its own."""
        items = self.list(value, path)
        if self.too_many(path, items, limit):
            return
        for i, raw in enumerate(items):
            yield f"{path}[{i}]", self.object(raw, f"{path}[{i}]")

    # -- pieces ---------------------------------------------------------------------------------

    def name(self, value: Any, path: str, check: Any) -> None:
        if not value:
            self.required(path)
        elif not isinstance(value, str):
            self.invalid(path, value, "must be a string")
        elif (err := check(value)) is not None:
            self.invalid(path, value, err)

    def metadata(self, obj: Mapping[str, Any], *, namespaced: bool) -> None:
        meta = self.object(obj.get("metadata"), "metadata")
        if meta.get("generateName") and not meta.get("name"):
            return
        self.name(meta.get("name"), "metadata.name", dns_subdomain_error)
        if namespaced and meta.get("namespace") is not None:
            self.name(meta.get("namespace"), "metadata.namespace", dns_label_error)

    def selectors(self, value: Any, path: str) -> None:
        for item_path, selector in self.objects(value, path, DEVICE_SELECTORS_MAX):
            cel = selector.get("cel")
            if cel is None:
                self.required(f"{item_path}.cel")
                continue
            expr_path = f"{item_path}.cel.expression"
            # A missing expression decodes as "" in the API server, which then fails to compile.
            expression = self.object(cel, f"{item_path}.cel").get("expression") or ""
            if not isinstance(expression, str):
                self.invalid(expr_path, expression, "must be a string")
                continue
            if len(expression.encode()) > CEL_EXPRESSION_MAX:
                self.add(expr_path, f"Too long: may not be more than {CEL_EXPRESSION_MAX} bytes")
                continue
            try:
                compiled = compile_selector(
                    expression, new=True, list_type_attributes=self.list_type_attributes
                )
            except CELCompileError as err:
                hints = tuple(f"{h.message}; try: {h.corrected}" for h in hints_for(expression, self.driver))
                if err.message.startswith("program instantiation failed"):
                    # CompileCELExpression files these as internal errors (field.InternalError).
                    self.add(expr_path, f"Internal error: {err.message}", hints)
                else:
                    self.invalid(expr_path, expression, err.message, hints)
                continue
            if compiled.estimated_cost > COST_LIMIT:
                self.add(
                    expr_path,
                    "Forbidden: too complex, exceeds cost limit",
                    (f"estimated worst-case cost {compiled.estimated_cost} (limit {COST_LIMIT})",),
                )

    def opaque(self, value: Any, path: str) -> None:
        config = self.object(value, path)
        opaque = config.get("opaque")
        if opaque is None:
            self.required(f"{path}.opaque")
            return
        opaque = self.object(opaque, f"{path}.opaque")
        driver = opaque.get("driver")
        self.name(driver, f"{path}.opaque.driver", driver_name_error)
        parameters = opaque.get("parameters")
        params_path = f"{path}.opaque.parameters"
        if parameters is None:
            self.required(params_path)
            return
        if not isinstance(parameters, Mapping):
            self.invalid(params_path, "<value omitted>", "parameters must be a valid JSON object")
            return
        size = len(json.dumps(parameters, separators=(",", ":")).encode())
        if size > OPAQUE_PARAMETERS_MAX:
            self.add(params_path, f"Too long: may not be more than {OPAQUE_PARAMETERS_MAX} bytes")
        if driver == self.driver:
            self.findings.extend(opaque_config_findings(self.driver, parameters, params_path))

    def tolerations(self, value: Any, path: str) -> None:
        for item_path, toleration in self.objects(value, path, DEVICE_TOLERATIONS_MAX):
            operator = toleration.get("operator") or "Equal"
            if operator not in ("Equal", "Exists"):
                self.add(
                    f"{item_path}.operator",
                    f'Unsupported value: {_json(operator)}: supported values: "Equal", "Exists"',
                )
            if operator == "Exists" and toleration.get("value"):
                self.invalid(
                    f"{item_path}.operator",
                    toleration.get("value"),
                    "value must be empty when `operator` is 'Exists'",
                )
            seconds = toleration.get("tolerationSeconds")
            if seconds is not None and (err := int64_error(seconds)) is not None:
                self.invalid(f"{item_path}.tolerationSeconds", seconds, err)
            effect = toleration.get("effect")
            if effect and effect not in TOLERATION_EFFECTS:
                self.add(
                    f"{item_path}.effect",
                    "Unsupported value: "
                    + _json(effect)
                    + ": supported values: "
                    + ", ".join(_json(e) for e in TOLERATION_EFFECTS),
                )

    def device_request(self, raw: Mapping[str, Any], path: str) -> None:
        """ExactDeviceRequest or DeviceSubRequest fields (without the name)."""
        self.name(raw.get("deviceClassName"), f"{path}.deviceClassName", dns_subdomain_error)
        self.selectors(raw.get("selectors"), f"{path}.selectors")
        mode = raw.get("allocationMode") or "ExactCount"
        count = raw.get("count")
        if mode == "All":
            if count is not None and (count != 0 or type(count) is not int):
                self.invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'")
        elif mode == "ExactCount":
            if count is not None and (err := int64_error(count)) is not None:
                self.invalid(f"{path}.count", count, err)
            elif count is not None and count <= 0:
                self.invalid(f"{path}.count", count, "must be greater than zero")
        else:
            self.add(
                f"{path}.allocationMode",
                f'Unsupported value: {_json(mode)}: supported values: "All", "ExactCount"',
            )
        admin = raw.get("adminAccess")
        if admin is not None and not isinstance(admin, bool):
            self.invalid(f"{path}.adminAccess", admin, "must be a boolean")
        self.tolerations(raw.get("tolerations"), f"{path}.tolerations")

    def claim_spec(self, spec: Mapping[str, Any], path: str, version: str) -> None:
        devices = self.object(spec.get("devices"), f"{path}.devices")
        path = f"{path}.devices"
        names: dict[str, set[str]] = {}
        requests = self.objects(devices.get("requests"), f"{path}.requests", DEVICE_REQUESTS_MAX)
        for item_path, request in requests:
            self.request(request, item_path, version, names)
        constraints = self.objects(devices.get("constraints"), f"{path}.constraints", DEVICE_CONSTRAINTS_MAX)
        for item_path, constraint in constraints:
            self.request_refs(constraint.get("requests"), f"{item_path}.requests", names)
            attribute = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
            field_name = (
                "matchAttribute" if constraint.get("matchAttribute") or not attribute else "distinctAttribute"
            )
            attr_path = f"{item_path}.{field_name}"
            if not attribute:
                self.required(attr_path)
            # A non-string is no domain/name pair either.
            elif (
                err := fully_qualified_name_error(attribute if isinstance(attribute, str) else "")
            ) is not None:
                self.invalid(attr_path, attribute, err)
        for item_path, config in self.objects(devices.get("config"), f"{path}.config", DEVICE_CONFIG_MAX):
            self.request_refs(config.get("requests"), f"{item_path}.requests", names)
            self.opaque(config, item_path)

    def request(self, raw: Mapping[str, Any], path: str, version: str, names: dict[str, set[str]]) -> None:
        name = raw.get("name")
        self.name(name, f"{path}.name", dns_label_error)
        if isinstance(name, str):
            if name in names:
                self.add(f"{path}.name", f"Duplicate value: {_json(name)}")
            names[name] = set()
        first = self.list(raw.get("firstAvailable"), f"{path}.firstAvailable")
        if version == "v1beta1":
            exact: Mapping[str, Any] | None = raw if raw.get("deviceClassName") else None
            exact_path = path
        else:
            exact = (
                self.object(raw.get("exactly"), f"{path}.exactly") if raw.get("exactly") is not None else None
            )
            exact_path = f"{path}.exactly"
        if first and exact is not None:
            self.invalid(
                path,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
            )
        elif not first and exact is None:
            self.required(path, "exactly one of `exactly` or `firstAvailable` is required")
        elif exact is not None:
            self.device_request(exact, exact_path)
        elif not self.too_many(f"{path}.firstAvailable", first, FIRST_AVAILABLE_MAX):
            for i, sub_raw in enumerate(first):
                sub_path = f"{path}.firstAvailable[{i}]"
                sub = self.object(sub_raw, sub_path)
                sub_name = sub.get("name")
                self.name(sub_name, f"{sub_path}.name", dns_label_error)
                if isinstance(name, str) and isinstance(sub_name, str):
                    if sub_name in names[name]:
                        self.add(f"{sub_path}.name", f"Duplicate value: {_json(sub_name)}")
                    names[name].add(sub_name)
                self.device_request(sub, sub_path)

    def request_refs(self, value: Any, path: str, names: dict[str, set[str]]) -> None:
        for i, ref in enumerate(self.list(value, path)):
            parts = str(ref).split("/")
            known = (
                isinstance(ref, str)
                and len(parts) <= 2
                and parts[0] in names
                and (len(parts) == 1 or parts[1] in names[parts[0]])
            )
            if not known:
                self.invalid(
                    f"{path}[{i}]",
                    ref,
                    _REQUEST_REF_DETAIL,
                )


def _version(obj: Mapping[str, Any]) -> str | None:
    group, _, version = str(obj.get("apiVersion", "")).partition("/")
    return version if group == RESOURCE_GROUP and version in API_VERSIONS else None


def validate_object(
    obj: Mapping[str, Any], driver: str, *, list_type_attributes: bool = False
) -> list[Finding]:
    """Findings for one DeviceClass, ResourceClaim or ResourceClaimTemplate, as an API server
    with the DRAListTypeAttributes gate at `list_type_attributes` finds them."""
    checker = _Checker(driver, list_type_attributes)
    version = _version(obj)
    if version is None:
        checker.add(
            "apiVersion",
            f"Unsupported value: {_json(obj.get('apiVersion'))}: supported values: "
            + ", ".join(f'"{RESOURCE_GROUP}/{v}"' for v in API_VERSIONS),
        )
        return checker.findings
    kind = obj.get("kind")
    if kind == "DeviceClass":
        checker.metadata(obj, namespaced=False)
        spec = checker.object(obj.get("spec"), "spec")
        checker.selectors(spec.get("selectors"), "spec.selectors")
        configs = checker.list(spec.get("config"), "spec.config")
        if not checker.too_many("spec.config", configs, DEVICE_CONFIG_MAX):
            for i, config in enumerate(configs):
                checker.opaque(config, f"spec.config[{i}]")
    elif kind == "ResourceClaim":
        checker.metadata(obj, namespaced=True)
        checker.claim_spec(checker.object(obj.get("spec"), "spec"), "spec", version)
    elif kind == "ResourceClaimTemplate":
        checker.metadata(obj, namespaced=True)
        spec = checker.object(obj.get("spec"), "spec")
        checker.claim_spec(checker.object(spec.get("spec"), "spec.spec"), "spec.spec", version)
    else:
        checker.add("kind", f"Unsupported value: {_json(kind)}")
    return checker.findings
