"""The parts of a `resource.k8s.io/v1` ResourceClaim that preparing reads, as typed data (pure).

A claim from the API server always has the right shapes, but one from a file (--claims-dir)
may have anything anywhere; decoding here turns a wrong type into that claim's error, naming
the field, instead of an exception that would fail the whole NodePrepareResources call.
Unknown fields are ignored, as a client built against an older API would. What a tenant may
write is bounded before anything walks or computes with it: nesting (MAX_DEPTH), names (the API
server's longest, 253 characters) and quantities (`quantity.tenant_quantity`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    StringConstraints,
    ValidationError,
)

from dradriver.fieldpath import field_path
from dradriver.nesting import MAX_DEPTH, too_deep
from dradriver.quantity import QuantityError, tenant_quantity


def _null_is_empty(value: Any) -> Any:
    """JSON null for a list is an empty list (Go's nil slice)."""
    return [] if value is None else value


def _null_is_default(value: Any) -> Any:
    return {} if value is None else value


def _bounded_quantity(text: str) -> str:
    try:
        tenant_quantity(text)
    except QuantityError as err:
        raise ValueError(str(err)) from None
    return text


#: A Kubernetes name (DNS subdomain, label, UID, `request/subrequest`): 253 characters at most.
Name = Annotated[StrictStr, StringConstraints(max_length=253)]
#: A quantity string a tenant wrote, bounded (length, exponent, magnitude) as it is decoded.
TenantQuantity = Annotated[StrictStr, AfterValidator(_bounded_quantity)]


class _Part(BaseModel):
    # Scalars are strict (5 is not a string); lists may come as JSON arrays.
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


#: Set by the resourceclaim controller on a claim made from a pod's ResourceClaimTemplate: the
#: pod's name for it (`pod.spec.resourceClaims[].name`), which places its device metadata.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


def _pod_claim_name_only(value: Any) -> Any:
    """Of the annotations, only the one preparing reads: the others may hold anything."""
    if isinstance(value, Mapping):
        return {k: v for k, v in value.items() if k == POD_CLAIM_NAME_ANNOTATION}
    return _null_is_default(value)


class ObjectMeta(_Part):
    name: Name = ""
    namespace: Name = ""
    uid: Name = ""
    annotations: Annotated[dict[Name, Name], BeforeValidator(_pod_claim_name_only)] = Field(
        default_factory=dict
    )

    @property
    def pod_claim_name(self) -> str | None:
        return self.annotations.get(POD_CLAIM_NAME_ANNOTATION) or None


class AllocationResult(_Part):
    request: Name = ""
    driver: Name = ""
    pool: Name = ""
    device: Name = ""
    admin_access: StrictBool | None = Field(default=None, alias="adminAccess")
    share_id: Name | None = Field(default=None, alias="shareID")
    consumed_capacity: Annotated[dict[Name, TenantQuantity], BeforeValidator(_null_is_default)] = Field(
        default_factory=dict, alias="consumedCapacity"
    )


class OpaqueConfig(_Part):
    driver: Name = ""
    #: Decoded by `prepare.config` when the driver is ours; anything JSON otherwise.
    parameters: Any = None


class AllocatedConfig(_Part):
    source: Name = ""
    requests: Annotated[tuple[Name, ...], BeforeValidator(_null_is_empty)] = ()
    opaque: OpaqueConfig | None = None


class DeviceAllocation(_Part):
    results: Annotated[tuple[AllocationResult, ...], BeforeValidator(_null_is_empty)] = ()
    config: Annotated[tuple[AllocatedConfig, ...], BeforeValidator(_null_is_empty)] = ()


class Allocation(_Part):
    devices: Annotated[DeviceAllocation, BeforeValidator(_null_is_default)] = Field(
        default_factory=DeviceAllocation
    )


class ClaimStatus(_Part):
    allocation: Allocation | None = None


class ResourceClaim(_Part):
    metadata: Annotated[ObjectMeta, BeforeValidator(_null_is_default)] = Field(default_factory=ObjectMeta)
    status: Annotated[ClaimStatus, BeforeValidator(_null_is_default)] = Field(default_factory=ClaimStatus)


#: How much of a too-deep location an error shows: enough to name the field that holds it.
_SHOWN_PARTS = 8


class ClaimFormatError(ValueError):
    """The claim object has a field of the wrong type; the message names the field."""


def decode_claim(raw: Any) -> ResourceClaim:
    """The typed claim; ClaimFormatError naming the first bad field (and how many more)."""
    if not isinstance(raw, Mapping):
        raise ClaimFormatError(f"must be an object, not {type(raw).__name__}")
    # Only `status` is walked: the model reads nothing deep elsewhere (metadata's fields are
    # strings), and the API server's managedFields are most of a claim's containers.
    if (deep := too_deep(raw.get("status"), MAX_DEPTH - 1)) is not None:
        deep = ("status", *deep)
        shown = field_path(deep[:_SHOWN_PARTS]) + ("…" if len(deep) > _SHOWN_PARTS else "")
        raise ClaimFormatError(f"{shown}: nested deeper than {MAX_DEPTH} levels (the limit)")
    try:
        return ResourceClaim.model_validate(raw)
    except ValidationError as err:
        first = err.errors(include_url=False, include_input=False)[0]
        more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
        raise ClaimFormatError(f"{field_path(first['loc'])}: {first['msg']}{more}") from None
