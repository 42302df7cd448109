"""ResourceQuota admission of ResourceClaims, counted as the Kubernetes 1.36 API server counts.

Pure (no I/O). Ported in behaviour from `pkg/quota/v1/evaluator/core/resource_claims.go` (what a
claim uses) and the ResourceQuota admission plugin (`k8s.io/apiserver/.../resourcequota`, which
quota entries a claim is checked against and the message it is refused with):

- every claim uses 1 of `count/resourceclaims.resource.k8s.io`;
- each request uses its count of `<class>.deviceclass.resource.k8s.io/devices`, an `All` request
  32 (the most devices one allocation holds), a `firstAvailable` request, per class, its largest
  alternative; capacity (a share's size) is not counted: a share counts as one device;
- with DRAExtendedResource (beta, on in 1.36) the same devices also count as
  `requests.deviceclass.resource.kubernetes.io/<class>` and, when the class has an
  `extendedResourceName`, as `requests.<that name>`.

A claim is refused when its new total would exceed a limit of any quota of its namespace (the API
server names the first it finds); it then counts against none. Admitted, it counts against every
quota naming what it uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from dradriver.offline.allocation.model import ALL, Claim
from dradriver.offline.extended import PodExtendedResources
from dradriver.offline.workloads import pod_spec
from dradriver.quantity import Quantity, QuantityError

CLAIM_COUNT = "count/resourceclaims.resource.k8s.io"
DEVICES_SUFFIX = ".deviceclass.resource.k8s.io/devices"
IMPLICIT_PREFIX = "requests.deviceclass.resource.kubernetes.io/"
REQUESTS_PREFIX = "requests."
#: What an `All` request counts as (resourceapi.AllocationResultsMaxSize).
ALL_DEVICES = 32
CLAIMS_RESOURCE = "resourceclaims.resource.k8s.io"


def devices_name(device_class: str) -> str:
    """The quota entry counting a class's devices: `<class>.deviceclass.resource.k8s.io/devices`."""
    return device_class + DEVICES_SUFFIX


def claim_usage(
    claim: Claim, extended: Mapping[str, str], *, extended_resources: bool = True
) -> dict[str, int]:
    """What the claim counts as, by quota entry. `extended` maps a class to its
    extendedResourceName; `extended_resources` is the DRAExtendedResource gate."""
    devices: dict[str, int] = {}
    for request in claim.requests:
        alternatives = request.first_available or ((request.exactly,) if request.exactly else ())
        largest: dict[str, int] = {}
        for sub in alternatives:
            count = ALL_DEVICES if sub.mode == ALL else sub.count
            largest[sub.device_class] = max(largest.get(sub.device_class, 0), count)
        for device_class, count in largest.items():
            devices[device_class] = devices.get(device_class, 0) + count
    usage = {CLAIM_COUNT: 1}
    for device_class, count in devices.items():
        usage[devices_name(device_class)] = count
        if extended_resources:
            usage[IMPLICIT_PREFIX + device_class] = count
            if device_class in extended:
                usage[REQUESTS_PREFIX + extended[device_class]] = count
    return usage


def counts_claims(resource: str, extended_names: Iterable[str], *, extended_resources: bool = True) -> bool:
    """Whether a quota entry is one ResourceClaims count against."""
    if resource == CLAIM_COUNT or resource.endswith(DEVICES_SUFFIX):
        return True
    return extended_resources and (
        resource.startswith(IMPLICIT_PREFIX)
        or resource in {REQUESTS_PREFIX + name for name in extended_names}
    )


# -- ResourceQuota objects ----------------------------------------------------------------------------


class QuotaInputError(ValueError):
    """A ResourceQuota that cannot be read: one line naming the object and field."""


class _Quantities(BaseModel):
    model_config = ConfigDict(extra="ignore")
    hard: dict[str, str] | None = None
    used: dict[str, str] | None = None

    @field_validator("hard", "used", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        # YAML writes `4` as a number; the API server accepts it as the quantity "4".
        if isinstance(value, Mapping):
            return {k: str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                    for k, v in value.items()}  # fmt: skip
        return value


class _Meta(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    namespace: str = ""


class _ResourceQuotaModel(BaseModel):
    model_config = ConfigDict(extra="ignore")
    kind: str
    metadata: _Meta
    spec: _Quantities = _Quantities()
    status: _Quantities | None = None


@dataclass(frozen=True)
class ResourceQuota:
    """A ResourceQuota as admission sees it: its limits and what is used of them.

    `used` is None when the object has no status (a manifest not yet applied): nothing is used.
    """

    name: str
    namespace: str
    hard: Mapping[str, Quantity]
    used: Mapping[str, Quantity] | None

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def _quantities(values: Mapping[str, str] | None, where: str) -> dict[str, Quantity]:
    out: dict[str, Quantity] = {}
    for key, text in (values or {}).items():
        try:
            out[key] = Quantity.parse(text)
        except QuantityError as err:
            raise QuotaInputError(f"{where}[{key}]: {text!r}: {err}") from None
    return out


def parse_resource_quota(obj: Mapping[str, Any]) -> ResourceQuota:
    """A ResourceQuota from its manifest or the API server's object. The limits are the status's
    (what admission reads; the quota controller copies spec.hard there) when it has them."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    ref = f"ResourceQuota {meta.get('name', '(unnamed)') if isinstance(meta, Mapping) else '(unnamed)'}"
    try:
        model = _ResourceQuotaModel.model_validate(obj)
    except ValidationError as err:
        first = err.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise QuotaInputError(f"{ref}: {path}: {first['msg']}") from None
    if model.kind != "ResourceQuota":
        raise QuotaInputError(f"{ref}: kind: must be ResourceQuota, not {model.kind!r}")
    status = model.status
    hard_source, where = (
        (status.hard, "status.hard") if status is not None and status.hard else (model.spec.hard, "spec.hard")
    )
    hard = _quantities(hard_source, f"{ref}: {where}")
    used = None if status is None or status.used is None else _quantities(status.used, f"{ref}: status.used")
    return ResourceQuota(model.metadata.name, model.metadata.namespace, hard, used)


# -- admission ---------------------------------------------------------------------------------------


def _count(value: int) -> Quantity:
    """resource.NewQuantity(value, DecimalSI), as the evaluator makes its counts."""
    return Quantity.parse(str(value))


def _pretty(values: Mapping[str, Quantity]) -> str:
    """The API server's prettyPrint: `name=quantity` sorted by name, comma-separated."""
    return ",".join(f"{key}={values[key].canonical()}" for key in sorted(values))


@dataclass(frozen=True)
class Refusal:
    """Why one quota refuses a claim: the entries it would exceed, or its unknown status."""

    quota: ResourceQuota
    exceeded: tuple[str, ...] = ()
    requested: Mapping[str, Quantity] = field(default_factory=dict)
    used: Mapping[str, Quantity] = field(default_factory=dict)
    limited: Mapping[str, Quantity] = field(default_factory=dict)
    #: Entries the quota names but whose use it does not know yet (no status.used for them).
    unknown: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        """The API server's reason, as in `... is forbidden: <message>`."""
        if self.unknown:
            return f"status unknown for quota: {self.quota.name}, resources: {','.join(self.unknown)}"
        return (
            f"exceeded quota: {self.quota.name}, requested: {_pretty(self.requested)}, "
            f"used: {_pretty(self.used)}, limited: {_pretty(self.limited)}"
        )

    def forbidden(self, name: str, resource: str = CLAIMS_RESOURCE) -> str:
        """The API server's whole error message for creating `name` (a claim, or a pod)."""
        return f'{resource} "{name}" is forbidden: {self.message}'


@dataclass
class QuotaLedger:
    """The quotas of some namespaces, charged claim by claim as admission charges them.

    A quota without a namespace (a manifest, applied with `kubectl -n`) applies in every one.
    """

    quotas: Sequence[ResourceQuota]
    #: Class name -> extendedResourceName, for the classes that have one.
    extended: Mapping[str, str] = field(default_factory=dict)
    extended_resources: bool = True
    _used: dict[int, dict[str, Quantity]] = field(init=False)

    def __post_init__(self) -> None:
        # Without a status, what the quota controller writes for an unused quota: 0 of each.
        zero = _count(0)
        self._used = {
            i: dict(q.used) if q.used is not None else dict.fromkeys(q.hard, zero)
            for i, q in enumerate(self.quotas)
        }

    def _matching(self, namespace: str) -> list[tuple[int, ResourceQuota, list[str]]]:
        out = []
        for i, quota in enumerate(self.quotas):
            if quota.namespace and quota.namespace != namespace:
                continue
            names = [
                r
                for r in quota.hard
                if counts_claims(r, self.extended.values(), extended_resources=self.extended_resources)
            ]
            if names:
                out.append((i, quota, names))
        return out

    def admit(self, namespace: str, usage: Mapping[str, int]) -> list[Refusal]:
        """The refusals of the namespace's quotas (in their order; the API server reports one of
        them); none: admitted, and charged to every quota that counts it."""
        refusals: list[Refusal] = []
        charges: list[tuple[int, dict[str, Quantity]]] = []
        for i, quota, names in self._matching(namespace):
            used = self._used[i]
            if quota.used is not None:
                unknown = tuple(sorted(r for r in names if r not in used))
                if unknown:
                    refusals.append(Refusal(quota, unknown=unknown))
                    continue
            requested = {r: _count(n) for r, n in usage.items() if r in quota.hard}
            total = {r: used.get(r, _count(0)).add(q) for r, q in requested.items()}
            exceeded = tuple(sorted(r for r, q in total.items() if q.compare(quota.hard[r]) > 0))
            if exceeded:
                refusals.append(
                    Refusal(
                        quota,
                        exceeded,
                        requested={r: requested[r] for r in exceeded},
                        used={r: used[r] for r in exceeded if r in used},
                        limited={r: quota.hard[r] for r in exceeded},
                    )
                )
            else:
                charges.append((i, total))
        if not refusals:
            for i, total in charges:
                self._used[i].update(total)
        return refusals

    def used(self, quota: ResourceQuota) -> Mapping[str, Quantity]:
        """What is used of `quota` after the claims admitted so far."""
        return self._used[self.quotas.index(quota)]


# -- what running the input creates -----------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """One object the API server admits on the way to running the input, and what it counts as.

    A ResourceClaim as given; one per pod of a workload for each ResourceClaimTemplate it names
    (the resourceclaim controller creates them); for a pod asking a class's extended resource,
    the pod itself (`requests.<name>`) and then the claim the scheduler creates for it.
    """

    kind: str
    namespace: str
    name: str
    #: What in the input it comes from, for messages.
    source: str
    usage: Mapping[str, int]
    #: The pod this object is created for only once that pod is admitted (an extended-resource claim).
    after_pod: str = ""

    @property
    def resource(self) -> str:
        return CLAIMS_RESOURCE if self.kind == "ResourceClaim" else "pods"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


#: Pods of one workload checked at most: all pods of a workload count alike, and a bound keeps a
#: manifest asking a million replicas from taking a million steps.
MAX_PODS = 1000
#: The field saying how many pods a workload runs at once.
_REPLICAS = {
    "Job": "parallelism",
    "Deployment": "replicas",
    "ReplicaSet": "replicas",
    "StatefulSet": "replicas",
}


def _replicas(obj: Mapping[str, Any]) -> int:
    """Pods a workload runs at once (at most MAX_PODS): replicas, a Job's parallelism; one for a
    Pod or a DaemonSet (one per node: checked as one)."""
    kind = str(obj.get("kind"))
    spec = _mapping(obj.get("spec"))
    if kind == "CronJob":
        spec, kind = _mapping(_mapping(spec.get("jobTemplate")).get("spec")), "Job"
    value = spec.get(_REPLICAS[kind]) if kind in _REPLICAS else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 1
    return min(value, MAX_PODS)


def _ref(obj: Mapping[str, Any], namespace: str) -> tuple[str, str]:
    meta = _mapping(obj.get("metadata"))
    name = str(meta.get("name") or meta.get("generateName") or "(unnamed)")
    return str(meta.get("namespace") or namespace), name


def admissions(
    claims: Sequence[tuple[Mapping[str, Any], Claim]],
    workloads: Sequence[tuple[Mapping[str, Any], PodExtendedResources | None]],
    extended: Mapping[str, str],
    *,
    namespace: str = "default",
    extended_resources: bool = True,
) -> list[Admission]:
    """Everything quota admission sees when the input is applied, in order: the claims as given,
    then per workload and pod the claims from its templates and its extended-resource pod and
    claim. Each workload comes with what its pods ask for through extended resources
    (`offline.extended.pod_extended_resources`; None: no pod spec, skipped), as each claim comes
    parsed. Objects without a namespace are in `namespace`. A template no workload names counts
    as one claim."""

    def usage(claim: Claim) -> dict[str, int]:
        return claim_usage(claim, extended, extended_resources=extended_resources)

    out: list[Admission] = []
    templates: dict[tuple[str, str], Claim] = {}
    for obj, claim in claims:
        ns, name = _ref(obj, namespace)
        if claim.kind == "ResourceClaimTemplate":
            templates[(ns, name)] = claim
        else:
            out.append(Admission("ResourceClaim", ns, name, f"ResourceClaim {ns}/{name}", usage(claim)))
    named: set[tuple[str, str]] = set()
    for obj, asked in workloads:
        spec = pod_spec(obj)
        if spec is None or asked is None:
            continue
        ns, name = _ref(obj, namespace)
        amounts = {REQUESTS_PREFIX + resource: count for resource, count in asked.totals.items()}
        for pod in range(_replicas(obj)):
            pod_name = name if obj.get("kind") == "Pod" else f"{name}-{pod}"
            where = f"{obj.get('kind')} {ns}/{name}" + (
                "" if obj.get("kind") == "Pod" else f", pod {pod + 1}"
            )
            for entry in spec.get("resourceClaims") or []:
                template = entry.get("resourceClaimTemplateName") if isinstance(entry, Mapping) else None
                if (ns, template) in templates:
                    named.add((ns, str(template)))
                    claim_name = f"{pod_name}-{entry.get('name')}"
                    out.append(
                        Admission(
                            "ResourceClaim", ns, claim_name, f"{where}, claim {entry.get('name')}",
                            usage(templates[(ns, str(template))]),
                        )
                    )  # fmt: skip
            if amounts:
                out.append(Admission("Pod", ns, pod_name, where, amounts))
                devices: dict[str, int] = {CLAIM_COUNT: 1}
                for request in asked.requests:
                    for key in (devices_name(request.device_class), IMPLICIT_PREFIX + request.device_class):
                        devices[key] = devices.get(key, 0) + request.count
                claim_name = f"{pod_name}-extended-resources"
                source = f"{where}, extended resources"
                out.append(Admission("ResourceClaim", ns, claim_name, source, devices, after_pod=pod_name))
    for (ns, name), claim in templates.items():
        if (ns, name) not in named:
            out.append(
                Admission(
                    "ResourceClaim", ns, name, f"ResourceClaimTemplate {ns}/{name} (one pod)", usage(claim)
                )
            )
    return out


@dataclass(frozen=True)
class Outcome:
    """An admission and the quotas refusing it (none: admitted)."""

    admission: Admission
    refusals: tuple[Refusal, ...]

    def messages(self) -> list[str]:
        """The API server's error for each refusal (it reports one of them)."""
        return [r.forbidden(self.admission.name, self.admission.resource) for r in self.refusals]


def check(ledger: QuotaLedger, planned: Sequence[Admission]) -> list[Outcome]:
    """Admit the planned objects one by one; a refused one is not charged, and the claim of a
    refused pod is never made."""
    outcomes: list[Outcome] = []
    refused_pods: set[tuple[str, str]] = set()
    for a in planned:
        if a.after_pod and (a.namespace, a.after_pod) in refused_pods:
            continue
        outcome = Outcome(a, tuple(ledger.admit(a.namespace, a.usage)))
        if outcome.refusals and a.kind == "Pod":
            refused_pods.add((a.namespace, a.name))
        outcomes.append(outcome)
    return outcomes
