"""Manifests for NVIDIA's DRA driver or its device plugin, rewritten for dradriver (pure, no I/O).

`migrate(objects, driver=...)` returns one `Migration` per input object: the objects it becomes
(none, when dradriver ships the equivalent; several, when a device-plugin workload gets the
ResourceClaimTemplates it now needs), every change with its field path and reason, and every
problem (something with no equivalent) with its field path. An object with a problem is never
half-translated silently: its problems say what is missing.

What is translated (docs/tools.md, "Moving from NVIDIA's driver or the device plugin"):
- DeviceClasses, ResourceClaims, ResourceClaimTemplates of `gpu.nvidia.com`: class names, CEL
  selectors (`migrate.selectors`), constraint attributes, health-taint tolerations, opaque config
  (`resource.nvidia.com/v1beta1` GpuConfig / MigDeviceConfig -> ours);
- workloads (Pod, Deployment, Job, ...): `nvidia.com/gpu` and `nvidia.com/mig-<profile>` limits
  become a ResourceClaimTemplate per container, and GPU Feature Discovery node selectors and
  required node affinities become CEL selectors of those requests (`migrate.gfd`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.devicemodel.attributes import DeviceType
from dradriver.names import dns_label_error, dns_subdomain_error
from dradriver.offline.migrate import gfd, nvidia
from dradriver.offline.migrate.quota import resource_quota
from dradriver.offline.migrate.selectors import rewrite, rewrite_qualified
from dradriver.offline.workloads import POD_SPEC_PATHS, pod_spec
from dradriver.prepare import config as our_config

RESOURCE_GROUP = "resource.k8s.io"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_ALL: frozenset[DeviceType] = frozenset({"gpu", "mig"})
_TYPE_TEST = re.compile(r"""\.type\s*==\s*["'](gpu|mig)["']""")
_PROFILE_TEST = re.compile(r"""\.profile\s*==\s*["']([^"']+)["']""")
_NOT_LABEL = re.compile(r"[^a-z0-9-]")

Outcome = Literal["migrated", "unchanged", "replaced", "failed"]


@dataclass(frozen=True)
class Change:
    """One edit: where (a field path of the input object), from what, to what, and why; `target`
    is the field path of the new value where it moved (Helm values), else empty."""

    path: str
    before: Any
    after: Any
    reason: str
    target: str = ""


@dataclass(frozen=True)
class Problem:
    """Something with no dradriver equivalent, at a field path of the input object."""

    path: str
    message: str


@dataclass
class Migration:
    """What one input object became."""

    source: Mapping[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    replaced_by: str = ""

    @property
    def outcome(self) -> Outcome:
        if self.problems:
            return "failed"
        if self.replaced_by:
            return "replaced"
        return "migrated" if self.changes else "unchanged"

    def change(self, path: str, before: Any, after: Any, reason: str, *, target: str = "") -> None:
        self.changes.append(Change(path, before, after, reason, target))

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))


def gpu_class(driver: str) -> str:
    """dradriver's DeviceClass for full GPUs (deviceclasses/gpu.yaml)."""
    return driver


def mig_class(driver: str) -> str:
    """dradriver's DeviceClass for MIG devices (deviceclasses/mig.yaml)."""
    return f"mig.{driver}"


def describe(obj: Mapping[str, Any]) -> str:
    """`Kind namespace/name` (or `Kind name`) for messages."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name = meta.get("name") or meta.get("generateName") or "(unnamed)"
    namespace = meta.get("namespace")
    return f"{obj.get('kind', '(no kind)')} {namespace + '/' if namespace else ''}{name}"


@dataclass
class _Context:
    """What translating one object needs to know about the others."""

    driver: str
    #: Input DeviceClasses renamed (NVIDIA-named custom classes) -> new name.
    renamed_classes: dict[str, str] = field(default_factory=dict)
    #: Device types each input DeviceClass selects.
    class_types: dict[str, frozenset[DeviceType]] = field(default_factory=dict)
    #: Extended resource names mapped by input DeviceClasses (served through them, not translated).
    extended: set[str] = field(default_factory=set)
    #: (namespace, name) of every ResourceClaimTemplate, given or generated.
    templates: set[tuple[str, str]] = field(default_factory=set)
    #: dradriver's own classes (as shipped, named for `driver`) other than the GPU class that hand
    #: out full GPUs, and those of one MIG profile by the device plugin's name of the profile
    #: (1g.10gb.me): what a migrated quota names.
    other_gpu_classes: list[str] = field(default_factory=list)
    mig_profile_classes: dict[str, str] = field(default_factory=dict)

    def device_class(self, name: Any) -> tuple[str, frozenset[DeviceType], str] | str:
        """(our class, device types, reason when renamed) for a class name, or a problem."""
        if not isinstance(name, str):
            return "deviceClassName must be a string"
        if name in nvidia.CLASSES:
            kind = nvidia.CLASSES[name]
            ours = gpu_class(self.driver) if kind == "gpu" else mig_class(self.driver)
            return (
                ours,
                frozenset({kind}),
                f"NVIDIA's class for {'full GPUs' if kind == 'gpu' else 'MIG devices'}",
            )
        if name in nvidia.UNSUPPORTED_CLASSES:
            return nvidia.UNSUPPORTED_CLASSES[name]
        if name in self.renamed_classes:
            new = self.renamed_classes[name]
            return new, self.class_types.get(name, _ALL), "renamed with its DeviceClass"
        if name.endswith("nvidia.com") and name not in self.class_types:
            return (
                f"{name} is a DeviceClass of NVIDIA's driver that dradriver does not ship; if it is your "
                "own, migrate it together with this claim"
            )
        return name, self.class_types.get(name, _ALL), ""

    def ours(self, class_name: str) -> bool:
        return (
            class_name in (gpu_class(self.driver), mig_class(self.driver)) or class_name in self.class_types
        )


def _api_version(obj: Mapping[str, Any]) -> tuple[str, str]:
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    return group, version


def _namespace(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("namespace") or "") if isinstance(meta, Mapping) else ""


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def _renamed_class(name: str, driver: str) -> str | None:
    """A custom class named under NVIDIA's domain gets ours, so that both can exist during a move."""
    for suffix in (f".{nvidia.DRIVER}", ".nvidia.com"):
        if name.endswith(suffix) and name not in nvidia.CLASSES and name not in nvidia.UNSUPPORTED_CLASSES:
            return name.removesuffix(suffix) + f".{driver}"
    return None


def _expressions(obj: Mapping[str, Any]) -> str:
    """A DeviceClass's CEL selectors, joined."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    return " ".join(
        str((s.get("cel") or {}).get("expression", ""))
        for s in spec.get("selectors") or []
        if isinstance(s, Mapping)
    )


def _class_device_types(obj: Mapping[str, Any]) -> frozenset[DeviceType]:
    kinds = set(_TYPE_TEST.findall(_expressions(obj)))
    types: set[DeviceType] = set()
    if "gpu" in kinds:
        types.add("gpu")
    if "mig" in kinds:
        types.add("mig")
    return frozenset(types) or _ALL


def _shipped(ctx: _Context, shipped: Sequence[Mapping[str, Any]]) -> None:
    for obj in shipped:
        name = _name(obj).removesuffix(DEFAULT_DRIVER_NAME) + ctx.driver
        types = _class_device_types(obj)
        if types == {"gpu"} and name != gpu_class(ctx.driver):
            ctx.other_gpu_classes.append(name)
        profile = _PROFILE_TEST.search(_expressions(obj))
        if types == {"mig"} and profile:
            # By the device plugin's name of the profile, which writes a "+" as "." (1g.10gb+me ->
            # nvidia.com/mig-1g.10gb.me): what a quota's requests.nvidia.com/mig-<profile> names.
            ctx.mig_profile_classes[profile.group(1).replace("+", ".")] = name


def _context(
    objects: Sequence[Mapping[str, Any]], driver: str, shipped: Sequence[Mapping[str, Any]]
) -> _Context:
    ctx = _Context(driver)
    _shipped(ctx, shipped)
    for obj in objects:
        group, _ = _api_version(obj)
        if group != RESOURCE_GROUP:
            continue
        if obj.get("kind") == "DeviceClass":
            name = _name(obj)
            if name in nvidia.CLASSES or name in nvidia.UNSUPPORTED_CLASSES:
                continue
            new = _renamed_class(name, driver)
            if new is not None:
                ctx.renamed_classes[name] = new
            ctx.class_types[name] = _class_device_types(obj)
            spec = obj.get("spec")
            if isinstance(spec, Mapping) and isinstance(spec.get("extendedResourceName"), str):
                ctx.extended.add(spec["extendedResourceName"])
        elif obj.get("kind") == "ResourceClaimTemplate":
            ctx.templates.add((_namespace(obj), _name(obj)))
    return ctx


def migrate(
    objects: Sequence[Mapping[str, Any]], *, driver: str, shipped: Sequence[Mapping[str, Any]] = ()
) -> list[Migration]:
    """Translate every object; the result has one Migration per input object, in order.
    `shipped`: dradriver's DeviceClasses (deviceclasses/, deviceclasses/optional/), which migrated
    ResourceQuotas name."""
    ctx = _context(objects, driver, shipped)
    return [_migrate_one(obj, ctx) for obj in objects]


def _migrate_one(obj: Mapping[str, Any], ctx: _Context) -> Migration:
    out = Migration(obj)
    group, version = _api_version(obj)
    kind = obj.get("kind")
    new = copy.deepcopy(dict(obj))
    if group == RESOURCE_GROUP:
        if version not in ("v1", "v1beta2", "v1beta1"):
            out.problem(
                "apiVersion",
                f"{obj.get('apiVersion')} is not served by the Kubernetes versions dradriver supports "
                "(1.34+)"
                + (
                    "; classic DRA (resourceClassName, parametersRef) was removed in 1.31: write a "
                    "resource.k8s.io/v1 claim with selectors and opaque config"
                    if version == "v1alpha2"
                    else ": write it as resource.k8s.io/v1"
                ),
            )
            return out
        if kind == "DeviceClass":
            _device_class(new, out, ctx)
        elif kind == "ResourceClaim":
            _claim_spec(new.get("spec"), "spec", version, out, ctx)
        elif kind == "ResourceClaimTemplate":
            spec = new.get("spec")
            _claim_spec(
                spec.get("spec") if isinstance(spec, Mapping) else None, "spec.spec", version, out, ctx
            )
        elif kind == "ResourceSlice":
            spec = new.get("spec")
            if isinstance(spec, Mapping) and spec.get("driver") == nvidia.DRIVER:
                out.problem("spec.driver", "ResourceSlices are published by the driver itself, not migrated")
        if kind in ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate") and version != "v1":
            _to_v1(new, version, out)
    elif group == nvidia.CLASSIC_PARAMETERS_GROUP:
        out.problem(
            "apiVersion",
            f"{kind} is classic DRA claim parameters (removed in Kubernetes 1.31): express them as "
            "selectors and opaque config in a resource.k8s.io/v1 claim",
        )
    elif obj.get("apiVersion") == nvidia.CONFIG_API_VERSION and str(kind).startswith("ComputeDomain"):
        out.problem("kind", "ComputeDomains (multi-node NVLink/IMEX) have no equivalent in dradriver")
    elif kind in POD_SPEC_PATHS:
        out.outputs.extend(_workload(new, out, ctx))
    elif obj.get("apiVersion") == "v1" and kind == "ResourceQuota":
        resource_quota(
            new,
            out,
            gpu_class(ctx.driver),
            mig_class(ctx.driver),
            ctx.other_gpu_classes,
            ctx.mig_profile_classes,
        )
    if not out.replaced_by and not out.problems:
        _leftovers(new, "", out, ctx)
    if out.problems or out.replaced_by:
        out.outputs = []
    else:
        out.outputs.append(new)
    return out


def _leftovers(value: Any, where: str, out: Migration, ctx: _Context) -> None:
    """NVIDIA names still in a translated object (a kind migrate does not know, say an MPIJob with
    `nvidia.com/gpu` limits in its pod templates): a problem each, never passed on silently."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            gpu_resource = key == GPU_RESOURCE or str(key).startswith(
                (MIG_RESOURCE_PREFIX, f"{GPU_RESOURCE}.")
            )
            if gpu_resource and key not in ctx.extended:
                out.problem(
                    f"{where}[{key}]",
                    f"{key} in an object migrate does not translate: rewrite its pod templates to use a "
                    "ResourceClaim, or serve nvidia.com/gpu through deviceclasses/extended-resource.yaml",
                )
            else:
                _leftovers(item, path, out, ctx)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _leftovers(item, f"{where}[{i}]", out, ctx)
    elif isinstance(value, str) and (
        value in (nvidia.DRIVER, nvidia.COMPUTE_DOMAIN_DRIVER)
        or value.startswith(("gpu.nvidia.com/", "resource.nvidia.com/"))
    ):
        out.problem(where, f"{value!r} names NVIDIA's driver in a field migrate does not translate")


#: The fields of a v1beta1 request that v1 moved into `exactly`.
_EXACT_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)


def _to_v1(obj: dict[str, Any], version: str, out: Migration) -> None:
    """resource.k8s.io/v1beta1 and v1beta2 objects as v1, the API every supported Kubernetes serves."""
    obj["apiVersion"] = f"{RESOURCE_GROUP}/v1"
    out.change(
        "apiVersion", f"{RESOURCE_GROUP}/{version}", obj["apiVersion"], "the GA API (Kubernetes 1.34+)"
    )
    if version != "v1beta1" or obj.get("kind") == "DeviceClass":
        return  # v1beta2 and DeviceClasses have v1's shape
    spec: Any = obj.get("spec")
    prefix = "spec"
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") if isinstance(spec, dict) else None
        prefix = "spec.spec"
    devices = spec.get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    for i, request in enumerate(requests or []):
        if not isinstance(request, dict) or "firstAvailable" in request:
            continue
        exact = {key: request.pop(key) for key in _EXACT_FIELDS if key in request}
        request["exactly"] = exact
        out.change(f"{prefix}.devices.requests[{i}]", list(exact), "exactly", "where v1 keeps them")


# -- DeviceClass ---------------------------------------------------------------------------------


def _device_class(obj: dict[str, Any], out: Migration, ctx: _Context) -> None:
    name = _name(obj)
    if name in nvidia.CLASSES:
        kind = nvidia.CLASSES[name]
        ours = gpu_class(ctx.driver) if kind == "gpu" else mig_class(ctx.driver)
        out.replaced_by = ours
        out.change(
            "metadata.name",
            name,
            ours,
            f"NVIDIA's built-in class; dradriver ships {ours} (deviceclasses/{kind}.yaml; "
            "deviceclasses/extended-resource.yaml maps nvidia.com/gpu)",
        )
        return
    if name in nvidia.UNSUPPORTED_CLASSES:
        out.problem("metadata.name", nvidia.UNSUPPORTED_CLASSES[name])
        return
    if name in ctx.renamed_classes:
        obj["metadata"]["name"] = ctx.renamed_classes[name]
        out.change("metadata.name", name, ctx.renamed_classes[name], "a class named for dradriver")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    types = ctx.class_types.get(name, _ALL)
    for i, selector in enumerate(spec.get("selectors") or []):
        _selector(selector, f"spec.selectors[{i}]", types, out, ctx)
    for i, entry in enumerate(spec.get("config") or []):
        _config(entry, f"spec.config[{i}]", out, ctx)


# -- claims --------------------------------------------------------------------------------------


def _claim_spec(spec: Any, path: str, version: str, out: Migration, ctx: _Context) -> None:
    if not isinstance(spec, dict):
        return
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        return
    request_types: dict[str, frozenset[DeviceType]] = {}
    ours: dict[str, bool] = {}
    for i, request in enumerate(devices.get("requests") or []):
        if not isinstance(request, dict):
            continue
        where = f"{path}.devices.requests[{i}]"
        name = str(request.get("name", ""))
        exact = request if version == "v1beta1" and "deviceClassName" in request else request.get("exactly")
        exact_where = where if exact is request else f"{where}.exactly"
        types: set[DeviceType] = set()
        if isinstance(exact, dict):
            kinds, mine = _exact(exact, exact_where, out, ctx)
            types |= kinds
            ours[name] = mine
        for j, sub in enumerate(request.get("firstAvailable") or []):
            if isinstance(sub, dict):
                kinds, mine = _exact(sub, f"{where}.firstAvailable[{j}]", out, ctx)
                types |= kinds
                ours[name] = ours.get(name, False) or mine
                ours[f"{name}/{sub.get('name', '')}"] = mine
                request_types[f"{name}/{sub.get('name', '')}"] = kinds
        request_types[name] = frozenset(types) or _ALL
    for i, constraint in enumerate(devices.get("constraints") or []):
        if isinstance(constraint, dict):
            _constraint(
                constraint,
                where=f"{path}.devices.constraints[{i}]",
                request_types=request_types,
                ours=ours,
                out=out,
                ctx=ctx,
            )
    for i, entry in enumerate(devices.get("config") or []):
        if not isinstance(entry, dict):
            continue
        _config(entry, f"{path}.devices.config[{i}]", out, ctx)


def _exact(
    exact: dict[str, Any], where: str, out: Migration, ctx: _Context
) -> tuple[frozenset[DeviceType], bool]:
    """Translate one exact request or subrequest; (device types it asks for, whether it is ours)."""
    current = exact.get("deviceClassName")
    mapped = ctx.device_class(current)
    if isinstance(mapped, str):
        out.problem(f"{where}.deviceClassName", mapped)
        return _ALL, False
    new_class, types, reason = mapped
    if new_class != current:
        exact["deviceClassName"] = new_class
        out.change(f"{where}.deviceClassName", current, new_class, reason)
    mine = ctx.ours(new_class) or current in nvidia.CLASSES
    for i, selector in enumerate(exact.get("selectors") or []):
        _selector(selector, f"{where}.selectors[{i}]", types, out, ctx)
    capacity = exact.get("capacity")
    if mine and isinstance(capacity, dict) and isinstance(capacity.get("requests"), dict):
        _capacity_requests(exact, capacity["requests"], f"{where}.capacity.requests", out)
    tolerations = exact.get("tolerations")
    if isinstance(tolerations, list):
        exact["tolerations"] = _tolerations(tolerations, f"{where}.tolerations", out, ctx)
    return types, mine


def _capacity_requests(exact: dict[str, Any], requests: dict[str, Any], where: str, out: Migration) -> None:
    """NVIDIA's consumable shares (--consumable-shares memory|unlimited|N) as dradriver's shares
    (serve --gpu-shares): `memory` keeps its name and meaning; one integer share is what a
    dradriver share gets by default (1/N of the GPU, serve --gpu-share-count N); more than one
    integer share has no exact equivalent."""
    for resource in list(requests):
        amount = requests[resource]
        at = f"{where}[{resource}]"
        if resource == "memory":
            out.change(at, amount, amount, nvidia.SHARE_MEMORY_NOTE)
        elif resource == "shares" and str(amount) == "1":
            del requests[resource]
            out.change(at, amount, None, nvidia.ONE_SHARE_NOTE)
        elif resource == "shares":
            out.problem(at, nvidia.MANY_SHARES_PROBLEM.format(amount=amount))
        else:
            out.problem(
                at,
                nvidia.UNSUPPORTED_CAPACITIES.get(
                    resource,
                    "a share of a dradriver GPU has only the capacities memory and computePercent",
                ),
            )
    if not requests:
        del exact["capacity"]


def _selector(selector: Any, where: str, types: frozenset[DeviceType], out: Migration, ctx: _Context) -> None:
    cel = selector.get("cel") if isinstance(selector, Mapping) else None
    expression = cel.get("expression") if isinstance(cel, dict) else None
    if not isinstance(expression, str):
        return
    result = rewrite(expression, driver=ctx.driver, device_types=types)
    for problem in result.problems:
        out.problem(f"{where}.cel.expression", problem)
    if not result.problems and result.expression != expression:
        assert isinstance(cel, dict)
        cel["expression"] = result.expression
        out.change(f"{where}.cel.expression", expression, result.expression, "; ".join(result.notes))


def _constraint(
    constraint: dict[str, Any],
    *,
    where: str,
    request_types: Mapping[str, frozenset[DeviceType]],
    ours: Mapping[str, bool],
    out: Migration,
    ctx: _Context,
) -> None:
    names = [str(n) for n in constraint.get("requests") or request_types]
    types = frozenset().union(*(request_types.get(n, _ALL) for n in names)) if names else _ALL
    for key in ("matchAttribute", "distinctAttribute"):
        current = constraint.get(key)
        if not isinstance(current, str):
            continue
        mapped = rewrite_qualified(current, driver=ctx.driver, device_types=types)
        if isinstance(mapped, str):
            out.problem(f"{where}.{key}", mapped)
            continue
        new, note = mapped
        if new == current:
            continue
        foreign = [n for n in names if not ours.get(n, False)]
        if new.startswith(f"{ctx.driver}/") and foreign:
            out.problem(
                f"{where}.{key}",
                f"{current} becomes {new}, which only dradriver's devices carry, but the constraint also "
                f"covers requests {foreign} of other drivers",
            )
            continue
        constraint[key] = new
        out.change(f"{where}.{key}", current, new, note or f"domain {nvidia.DRIVER} -> {ctx.driver}")


def _tolerations(tolerations: list[Any], where: str, out: Migration, ctx: _Context) -> list[Any]:
    unhealthy = f"{ctx.driver}/unhealthy"
    kept: list[Any] = []
    for i, toleration in enumerate(tolerations):
        key = toleration.get("key") if isinstance(toleration, dict) else None
        if key == nvidia.TAINT_UNMONITORED:
            out.change(
                f"{where}[{i}]",
                toleration,
                None,
                "dradriver never taints a device it cannot watch (its health is UNKNOWN): not needed",
            )
            continue
        if key in (nvidia.TAINT_XID, nvidia.TAINT_GPU_LOST):
            assert isinstance(toleration, dict)
            new = dict(toleration, key=unhealthy)
            if key == nvidia.TAINT_GPU_LOST:
                new.update(operator="Equal", value="gpu-lost")
                reason = "dradriver's taint is <driver>/unhealthy with the reason (gpu-lost) as value"
            elif toleration.get("operator", "Equal") == "Exists":
                reason = (
                    "dradriver's taint is <driver>/unhealthy with the reason as value; Exists also "
                    "tolerates a lost GPU and threshold taints"
                )
            else:
                reason = "dradriver's taint is <driver>/unhealthy with the XID number as value"
            out.change(f"{where}[{i}]", toleration, new, reason)
            kept.append(new)
            continue
        kept.append(toleration)
    return kept


# -- opaque config -------------------------------------------------------------------------------


def _config(entry: Any, where: str, out: Migration, ctx: _Context) -> None:
    opaque = entry.get("opaque") if isinstance(entry, Mapping) else None
    if not isinstance(opaque, dict):
        return
    driver = opaque.get("driver")
    if driver == nvidia.COMPUTE_DOMAIN_DRIVER:
        out.problem(
            f"{where}.opaque.driver",
            "ComputeDomains (multi-node NVLink/IMEX) have no equivalent in dradriver",
        )
        return
    if driver != nvidia.DRIVER:
        return
    opaque["driver"] = ctx.driver
    out.change(f"{where}.opaque.driver", driver, ctx.driver, "our driver")
    parameters = opaque.get("parameters")
    translated = _parameters(parameters, f"{where}.opaque.parameters", out)
    if translated is None:
        return
    opaque["parameters"] = translated
    for path, message in our_config.problems(translated, f"{where}.opaque.parameters"):
        out.problem(path, message)


def _parameters(parameters: Any, where: str, out: Migration) -> dict[str, Any] | None:
    if not isinstance(parameters, Mapping):
        out.problem(where, "must be an object (resource.nvidia.com/v1beta1 GpuConfig or MigDeviceConfig)")
        return None
    new = copy.deepcopy(dict(parameters))
    if new.get("apiVersion") != nvidia.CONFIG_API_VERSION:
        out.problem(
            f"{where}.apiVersion", f"{new.get('apiVersion')!r} is not NVIDIA's {nvidia.CONFIG_API_VERSION}"
        )
        return None
    new["apiVersion"] = our_config.API_VERSION
    out.change(f"{where}.apiVersion", nvidia.CONFIG_API_VERSION, our_config.API_VERSION, "our config API")
    kind = new.get("kind")
    if kind == "VfioDeviceConfig":
        out.problem(f"{where}.kind", "VFIO passthrough has no equivalent in dradriver")
        return None
    if kind not in ("GpuConfig", "MigDeviceConfig"):
        out.problem(
            f"{where}.kind", f"{kind!r} has no equivalent (dradriver has GpuConfig and MigDeviceConfig)"
        )
        return None
    sharing = new.get("sharing")
    if not isinstance(sharing, dict):
        return new
    if kind == "MigDeviceConfig" and sharing.get("strategy") == "TimeSlicing":
        out.problem(
            f"{where}.sharing.strategy",
            "time-slicing on MIG devices has no equivalent: NVIDIA's driver accepts and ignores it, "
            "dradriver refuses it (a MIG device is already an isolated partition): drop the config, "
            "or use MPS",
        )
        return None
    for old, renamed in (("timeSlicingConfig", "timeSlicing"), ("mpsConfig", "mps")):
        if old in sharing:
            sharing[renamed] = sharing.pop(old)
            out.change(f"{where}.sharing.{old}", old, renamed, "our field name")
    mps = sharing.get("mps")
    if isinstance(mps, dict):
        _mps(mps, f"{where}.sharing.mpsConfig", out)
    return new


def _mps(mps: dict[str, Any], where: str, out: Migration) -> None:
    if "defaultPerDevicePinnedMemoryLimit" in mps:
        limits = mps.pop("defaultPerDevicePinnedMemoryLimit")
        mps["perDevicePinnedMemoryLimit"] = limits
        out.change(
            f"{where}.defaultPerDevicePinnedMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
            "perDevicePinnedMemoryLimit",
            "our field name (keyed by GPU UUID or our device name)",
        )
        for key in limits if isinstance(limits, Mapping) else ():
            if str(key).isdigit():
                out.problem(
                    f"{where}.defaultPerDevicePinnedMemoryLimit[{key}]",
                    "a key by position among the claim's devices has no equivalent: key by GPU UUID",
                )
    if "multiUser" in mps:
        value = mps.pop("multiUser")
        if value:
            out.problem(f"{where}.multiUser", "a multi-user MPS daemon has no equivalent in dradriver")
        else:
            out.change(f"{where}.multiUser", value, None, "false is the only mode dradriver runs")


# -- workloads -----------------------------------------------------------------------------------


@dataclass
class _GpuRequest:
    """A device-plugin resource of one container, as a request of its new claim template."""

    container: int
    init: bool
    resource: str
    count: int

    @property
    def device_type(self) -> DeviceType:
        return "gpu" if self.resource == GPU_RESOURCE else "mig"

    @property
    def profile(self) -> str:
        return self.resource.removeprefix(MIG_RESOURCE_PREFIX)

    @property
    def request_name(self) -> str:
        return "gpu" if self.device_type == "gpu" else _NOT_LABEL.sub("-", f"mig-{self.profile}")


def _workload(obj: dict[str, Any], out: Migration, ctx: _Context) -> list[dict[str, Any]]:
    """Rewrite a workload in place; returns the ResourceClaimTemplates it now needs."""
    spec = pod_spec(obj)
    if not isinstance(spec, dict):
        return []
    where = ".".join(POD_SPEC_PATHS[str(obj.get("kind"))])
    _flatten_claim_sources(spec, where, out)
    requests = _device_plugin_resources(spec, where, out, ctx)
    selection = _gfd_requirements(spec, where, out)
    if selection and not requests:
        out.problem(
            selection.first_path(),
            "GPU Feature Discovery labels select the node, but this pod asks for no nvidia.com GPU "
            "resource: put the selectors into the CEL selectors of the ResourceClaim it uses",
        )
        return []
    by_container: dict[tuple[bool, int], list[_GpuRequest]] = {}
    for request in requests:
        by_container.setdefault((request.init, request.container), []).append(request)
    templates = []
    for (init, index), group in by_container.items():
        templates.append(
            _template_for(
                obj,
                spec,
                where=where,
                init=init,
                index=index,
                group=group,
                selection=selection,
                out=out,
                ctx=ctx,
            )
        )
    return templates


def _flatten_claim_sources(spec: dict[str, Any], where: str, out: Migration) -> None:
    for i, entry in enumerate(spec.get("resourceClaims") or []):
        source = entry.get("source") if isinstance(entry, dict) else None
        if isinstance(source, Mapping):
            assert isinstance(entry, dict)
            entry.pop("source")
            entry.update(source)
            out.change(
                f"{where}.resourceClaims[{i}].source",
                dict(source),
                dict(source),
                "Kubernetes 1.31+ field layout",
            )


def _device_plugin_resources(
    spec: dict[str, Any], where: str, out: Migration, ctx: _Context
) -> list[_GpuRequest]:
    found: list[_GpuRequest] = []
    for field_name, init in (("initContainers", True), ("containers", False)):
        for index, container in enumerate(spec.get(field_name) or []):
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            base = f"{where}.{field_name}[{index}].resources"
            names = {
                r
                for part in ("limits", "requests")
                for r in (resources.get(part) or {})
                if r == GPU_RESOURCE
                or str(r).startswith(MIG_RESOURCE_PREFIX)
                or r == f"{GPU_RESOURCE}.shared"
            }
            for resource in sorted(names):
                if resource in ctx.extended:
                    continue  # a DeviceClass of this input maps it: served through that class
                if str(resource).endswith(".shared"):
                    out.problem(
                        f"{base}.limits[{resource}]",
                        "device-plugin sharing replicas (time-slicing or MPS) have no per-pod equivalent: "
                        "let the pods share one ResourceClaim (with a GpuConfig for the sharing)",
                    )
                    continue
                amount = (resources.get("limits") or {}).get(
                    resource, (resources.get("requests") or {}).get(resource)
                )
                try:
                    count = int(str(amount))
                except ValueError:
                    out.problem(f"{base}.limits[{resource}]", f"{amount!r} is not a whole number of devices")
                    continue
                for part in ("limits", "requests"):
                    if resource in (resources.get(part) or {}):
                        resources[part].pop(resource)
                        if not resources[part]:
                            resources.pop(part)
                reason = (
                    "device-plugin resource, now a request of the ResourceClaimTemplate below"
                    if count > 0
                    else "zero devices: nothing to ask for"
                )
                out.change(f"{base}.limits[{resource}]", amount, None, reason)
                if count > 0:
                    found.append(_GpuRequest(index, init, str(resource), count))
    return found


@dataclass
class _NodeSelection:
    """GFD requirements taken off a pod: all of `required`, and one of `alternatives` if any
    (node selector terms are ORed), each with the field path it came from."""

    required: list[tuple[gfd.Requirement, str]] = field(default_factory=list)
    alternatives: list[tuple[list[gfd.Requirement], str]] = field(default_factory=list)

    def first_path(self) -> str:
        return self.required[0][1] if self.required else self.alternatives[0][1]

    def __bool__(self) -> bool:
        return bool(self.required or self.alternatives)


def _requirement(expression: Mapping[str, Any]) -> gfd.Requirement:
    values = tuple(str(v) for v in expression.get("values") or [])
    return gfd.Requirement(str(expression.get("key", "")), str(expression.get("operator", "")), values)


def _gfd_requirements(spec: dict[str, Any], where: str, out: Migration) -> _NodeSelection:
    """The pod's GFD label requirements, removed from its nodeSelector and required node affinity.
    Terms that mix GFD labels with other labels and cannot be split are a problem."""
    selection = _NodeSelection()
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict):
        keys = [k for k in selector if gfd.is_gfd(str(k))]
        for key in keys:
            selection.required.append(
                (gfd.Requirement(key, "In", (str(selector.pop(key)),)), f"{where}.nodeSelector[{key}]")
            )
        if keys:
            if not selector:
                spec.pop("nodeSelector")
            out.change(
                f"{where}.nodeSelector",
                keys,
                None,
                "GPU Feature Discovery labels: now CEL selectors of the claim",
            )
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if not isinstance(node, dict):
        return selection
    for i, preferred in enumerate(node.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        expressions = ((preferred or {}).get("preference") or {}).get("matchExpressions") or []
        if any(gfd.is_gfd(str(e.get("key", ""))) for e in expressions):
            out.problem(
                f"{where}.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}]",
                "a preferred node affinity on GFD labels has no equivalent: use firstAvailable subrequests",
            )
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list) or not terms:
        return selection
    base = f"{where}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    ours = [
        [e for e in (t or {}).get("matchExpressions") or [] if gfd.is_gfd(str(e.get("key", "")))]
        for t in terms
    ]
    if not any(ours):
        return selection
    if len(terms) > 1:
        mixed = [
            i
            for i, (term, found) in enumerate(zip(terms, ours, strict=True))
            if not found
            or (term or {}).get("matchFields")
            or len(found) < len((term or {}).get("matchExpressions") or [])
        ]
        if mixed:
            out.problem(
                f"{base}[{mixed[0]}]",
                "node selector terms are ORed: GFD labels can move into the claim only when every term "
                "has GFD labels and nothing else",
            )
            return selection
        selection.alternatives = [
            ([_requirement(e) for e in found], f"{base}[{i}]") for i, found in enumerate(ours)
        ]
        assert isinstance(required, dict)
        required.pop("nodeSelectorTerms")
        out.change(
            base,
            [[e["key"] for e in found] for found in ours],
            None,
            "GFD labels: now one CEL selector of the claim (the terms ORed)",
        )
    else:
        term = terms[0]
        kept = [e for e in term.get("matchExpressions") or [] if e not in ours[0]]
        selection.required += [(_requirement(e), f"{base}[0].matchExpressions") for e in ours[0]]
        if kept:
            term["matchExpressions"] = kept
        else:
            term.pop("matchExpressions")
        if not term:
            assert isinstance(required, dict)
            required.pop("nodeSelectorTerms")
        out.change(
            f"{base}[0].matchExpressions",
            [e["key"] for e in ours[0]],
            None,
            "GFD labels: now CEL selectors of the claim",
        )
    _prune_affinity(spec)
    return selection


def _prune_affinity(spec: dict[str, Any]) -> None:
    affinity = spec.get("affinity")
    if not isinstance(affinity, dict):
        return
    node = affinity.get("nodeAffinity")
    if isinstance(node, dict):
        required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
        if isinstance(required, dict) and not required.get("nodeSelectorTerms"):
            node.pop("requiredDuringSchedulingIgnoredDuringExecution")
        if not node:
            affinity.pop("nodeAffinity")
    if not affinity:
        spec.pop("affinity")


def _selectors_for(
    device_type: DeviceType, selection: _NodeSelection, out: Migration, ctx: _Context
) -> list[str]:
    """CEL expressions for a request of `device_type`: one per requirement, one for the alternatives."""

    def expressions(requirements: Sequence[gfd.Requirement], where: str) -> list[str]:
        found = []
        for req in requirements:
            translated = gfd.translate(req, device_type, ctx.driver)
            if isinstance(translated, str):
                out.problem(where, translated)
            elif translated.expression is not None:
                found.append(translated.expression)
            elif Change(where, req.key, None, translated.note) not in out.changes:
                out.change(where, req.key, None, translated.note)
        return found

    selectors = [e for req, where in selection.required for e in expressions([req], where)]
    if selection.alternatives:
        terms = []
        for requirements, where in selection.alternatives:
            parts = expressions(requirements, where)
            terms.append(
                " && ".join(f"({p})" for p in parts) if len(parts) > 1 else (parts[0] if parts else "true")
            )
        selectors.append(" || ".join(f"({t})" for t in terms))
    return selectors


def _template_for(
    workload: dict[str, Any],
    spec: dict[str, Any],
    *,
    where: str,
    init: bool,
    index: int,
    group: list[_GpuRequest],
    selection: _NodeSelection,
    out: Migration,
    ctx: _Context,
) -> dict[str, Any]:
    containers = spec["initContainers" if init else "containers"]
    container = containers[index]
    container_name = str(container.get("name", f"container-{index}"))
    namespace = _namespace(workload)
    meta = workload.get("metadata") or {}
    workload_name = _name(workload) or str(meta.get("generateName", "")).rstrip("-") or "pod"
    template_name = f"{workload_name}-{container_name}-gpus"
    claim_name = f"{container_name}-gpus"
    if dns_label_error(claim_name) is not None:
        claim_name = f"gpus-{index}"
    container_path = f"{where}.{'initContainers' if init else 'containers'}[{index}]"
    if (error := dns_subdomain_error(template_name)) is not None:
        out.problem(
            container_path, f"the ResourceClaimTemplate name {template_name!r} would be invalid: {error}"
        )
    if (namespace, template_name) in ctx.templates:
        out.problem(container_path, f"a ResourceClaimTemplate {template_name!r} already exists in this input")
    ctx.templates.add((namespace, template_name))
    if any(entry.get("name") == claim_name for entry in spec.get("resourceClaims") or []):
        out.problem(container_path, f"the pod already has a resource claim named {claim_name!r}")
    requests = []
    for request in group:
        exact: dict[str, Any] = {
            "deviceClassName": gpu_class(ctx.driver)
            if request.device_type == "gpu"
            else mig_class(ctx.driver),
        }
        if request.count != 1:
            exact["count"] = request.count
        selectors = []
        if request.device_type == "mig":
            selectors.append(f'device.attributes["{ctx.driver}"].profile == "{request.profile}"')
        selectors += _selectors_for(request.device_type, selection, out, ctx)
        if selectors:
            exact["selectors"] = [{"cel": {"expression": e}} for e in selectors]
        requests.append({"name": request.request_name, "exactly": exact})
    metadata: dict[str, Any] = {"name": template_name}
    if namespace:
        metadata["namespace"] = namespace
    template = {
        "apiVersion": f"{RESOURCE_GROUP}/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": {"devices": {"requests": requests}}},
    }
    spec.setdefault("resourceClaims", []).append(
        {"name": claim_name, "resourceClaimTemplateName": template_name}
    )
    container.setdefault("resources", {}).setdefault("claims", []).append({"name": claim_name})
    out.change(
        f"{container_path}.resources.claims",
        None,
        claim_name,
        f"the container's GPUs: ResourceClaimTemplate {template_name} "
        f"({', '.join(f'{r.count}x {r.resource}' for r in group)})",
    )
    return template
