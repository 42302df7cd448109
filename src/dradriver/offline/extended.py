"""Extended resources backed by DRA (DRAExtendedResource, KEP-5004): which device class backs
which resource name, and what a pod's containers ask for, as Kubernetes 1.37 reads them (pure).

Ported in behaviour from kube-scheduler (`DeviceClassMapping`, and `createRequestsAndMappings`
of the dynamicresources plugin), the API server's validation of a container's resources and its
`PodRequests` (what ResourceQuota counts for a pod):
- a class backs its `extendedResourceName`, or else `deviceclass.resource.kubernetes.io/<name>`;
  of several classes for one name, the newest wins (then the first by name);
- every container asks, init containers first: its index counts `initContainers` then
  `containers`. Its requests are `resources.requests`, each defaulting from its limit;
- an extended resource is a whole number of devices, at least 0. It is not overcommitted: a
  request needs a limit, and equals it. A request for 0 asks for nothing;
- the scheduler's claim for the pod has a request per regular container or sidecar and resource,
  named `container-<i>-request-<j>`, where j is the resource's place among the container's
  requests sorted by name. A plain init container reuses the devices of the containers after it
  and asks only for what they lack, the largest such ask kept (`_claim_requests`). The requests
  are sorted by name;
- the pod as a whole asks for its containers' sum, or for more if an init container asks for
  more. A sidecar (an init container with `restartPolicy: Always`) runs beside the ones after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dradriver.offline.allocation.model import object_ref
from dradriver.offline.workloads import POD_SPEC_PATHS, pod_spec
from dradriver.quantity import QuantityError, tenant_quantity

#: The implicit extended resource name of a class without an `extendedResourceName`.
DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"


class ExtendedResourceError(ValueError):
    """A container's extended resource the API server would refuse; the message names the object
    and the field from its root."""


@dataclass(frozen=True)
class ExtendedRequest:
    """One request of the claim the scheduler makes for a pod."""

    name: str
    device_class: str
    count: int


@dataclass(frozen=True)
class PodExtendedResources:
    """What one pod asks for through extended resources backed by DRA."""

    #: The requests of the claim the scheduler makes for it, sorted by name.
    requests: tuple[ExtendedRequest, ...]
    #: The pod's own request of each resource, as its ResourceQuota usage counts it.
    totals: dict[str, int]


def resource_classes(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass that backs it, as the scheduler maps them."""
    candidates: dict[str, list[tuple[str, str]]] = {}
    for cls in classes:
        meta, spec = cls.get("metadata"), cls.get("spec")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            continue
        explicit = spec.get("extendedResourceName") if isinstance(spec, Mapping) else None
        resource = explicit if isinstance(explicit, str) and explicit else DEVICE_CLASS_PREFIX + name
        created = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
        # RFC 3339 in UTC sorts as text; a class from a file has none and counts as oldest.
        candidates.setdefault(resource, []).append((created if isinstance(created, str) else "", name))
    # Sorted by name first: of the newest, the first by name.
    return {
        resource: max(sorted(found, key=lambda c: c[1]), key=lambda c: c[0])[1]
        for resource, found in candidates.items()
    }


def pod_extended_resources(obj: Mapping[str, Any], backed: Mapping[str, str]) -> PodExtendedResources | None:
    """What the pod (or each pod of a workload) asks for through the resources in `backed`
    (resource name -> class); None for an object that has no pod spec. ExtendedResourceError for
    an amount the API server would refuse."""
    spec = pod_spec(obj)
    if spec is None:
        return None
    root = f"{object_ref(obj)}: {'.'.join(POD_SPEC_PATHS[str(obj.get('kind'))])}"
    containers = [
        (
            f"{root}.{field}[{i}]",
            container if isinstance(container, Mapping) else {},
            field == "initContainers",
        )
        for field in ("initContainers", "containers")
        for i, container in enumerate(_list(spec.get(field)))
    ]
    asked: list[_Asked] = []
    for index, (where, container, init) in enumerate(containers):
        effective = _requests(container)
        order = {resource: j for j, resource in enumerate(sorted(effective))}
        amounts = _amounts(where, container, effective, backed)
        names = {resource: f"container-{index}-request-{order[resource]}" for resource in amounts}
        sidecar = init and container.get("restartPolicy") == "Always"
        asked.append(_Asked(amounts, names, short_lived=init and not sidecar, sidecar=sidecar))
    wanted = sorted({resource for a in asked for resource, count in a.amounts.items() if count > 0})
    requests = sorted(
        (r for resource in wanted for r in _claim_requests(asked, resource, backed[resource])),
        key=lambda r: r.name,
    )
    totals = _pod_totals(asked)
    return PodExtendedResources(tuple(requests), {k: v for k, v in totals.items() if v > 0})


@dataclass(frozen=True)
class _Asked:
    """What one container asks for, by resource, and the name its own request would have."""

    amounts: dict[str, int]
    names: dict[str, str]
    #: An init container that is no sidecar: it runs alone, before the containers after it.
    short_lived: bool
    sidecar: bool


def _claim_requests(asked: list[_Asked], resource: str, device_class: str) -> list[ExtendedRequest]:
    """The scheduler's requests for one resource. A regular container or sidecar gets its own. A
    plain init container first reuses the devices of the containers and sidecars after it, which
    have not started yet, and asks only for what they lack; the plain init containers run one by
    one, so only the largest of those asks is kept."""
    own = {
        i: ExtendedRequest(a.names[resource], device_class, a.amounts[resource])
        for i, a in enumerate(asked)
        if not a.short_lived and a.amounts.get(resource, 0) > 0
    }
    largest: ExtendedRequest | None = None
    for i, a in enumerate(asked):
        needed = a.amounts.get(resource, 0) if a.short_lived else 0
        reused = 0
        for later in (r for j, r in own.items() if j > i):
            if reused >= needed:
                break
            reused += later.count
        if needed > reused and (largest is None or largest.count < needed - reused):
            largest = ExtendedRequest(a.names[resource], device_class, needed - reused)
    return [*own.values(), *([largest] if largest is not None else [])]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _resources(container: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    resources = container.get("resources")
    found = resources.get(kind) if isinstance(resources, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's requests as the API server defaults them: each from its limit."""
    return {**_resources(container, "limits"), **_resources(container, "requests")}


def _amounts(
    where: str, container: Mapping[str, Any], effective: Mapping[str, Any], backed: Mapping[str, str]
) -> dict[str, int]:
    """The container's whole amount of each backed resource it asks for."""
    limits, requests = _resources(container, "limits"), _resources(container, "requests")
    amounts = {}
    for resource in sorted(effective):
        if resource not in backed:
            continue
        if resource not in limits:
            raise ExtendedResourceError(
                f"{where}.resources.limits[{resource}]: must be set: an extended resource is not "
                "overcommitted, its request needs a limit"
            )
        limit = _count(f"{where}.resources.limits[{resource}]", limits[resource])
        if resource in requests:
            request = _count(f"{where}.resources.requests[{resource}]", requests[resource])
            if request != limit:
                raise ExtendedResourceError(
                    f"{where}.resources.requests[{resource}]: must be equal to its limit of {limit} "
                    "(an extended resource is not overcommitted)"
                )
        amounts[resource] = limit
    return amounts


def _count(where: str, value: Any) -> int:
    """A whole number of devices, from a quantity (a YAML integer or a string such as "2")."""
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str):
        raise ExtendedResourceError(f"{where}: must be a quantity such as 1, not {type(value).__name__}")
    try:
        exact = tenant_quantity(text).exact()
    except QuantityError as err:
        raise ExtendedResourceError(f"{where}: {text!r}: {err}") from None
    if exact < 0:
        raise ExtendedResourceError(f"{where}: {text!r}: must be greater than or equal to 0")
    if exact.denominator != 1:
        raise ExtendedResourceError(f"{where}: {text!r}: must be an integer (a number of devices)")
    return int(exact)


def _pod_totals(asked: list[_Asked]) -> dict[str, int]:
    """The pod's request of each resource (`PodRequests`): the regular containers' and sidecars'
    sum, or a plain init container's need with the sidecars started before it, whichever is more."""
    totals: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    peak: dict[str, int] = {}
    for a in asked:
        if a.short_lived:
            need = dict(a.amounts)
            _add(need, sidecars)
            for resource, count in need.items():
                peak[resource] = max(peak.get(resource, 0), count)
        else:
            _add(totals, a.amounts)
            if a.sidecar:
                _add(sidecars, a.amounts)
                for resource, count in sidecars.items():
                    peak[resource] = max(peak.get(resource, 0), count)
    for resource, count in peak.items():
        totals[resource] = max(totals.get(resource, 0), count)
    return totals


def _add(into: dict[str, int], amounts: Mapping[str, int]) -> None:
    for resource, count in amounts.items():
        into[resource] = into.get(resource, 0) + count
