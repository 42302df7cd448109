"""Device metadata for workloads (KEP-5304, beta in 1.37): what each container of a claim reads
about its devices, rendered here without I/O (`prepare.metadata_files` writes it).

The protocol, as the 1.37 kubelet plugin helper (`k8s.io/dynamic-resource-allocation/kubeletplugin`)
and `k8s.io/dynamic-resource-allocation/api/metadata` define it:
- one file per claim and (base) request, in the container at
  `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`,
  or `resourceclaimtemplates/<pod claim name>/...` for a claim made from a template (the claim's
  `resource.kubernetes.io/pod-claim-name` annotation, which the resourceclaim controller sets);
- the file is a JSON stream of the same `DeviceMetadata` object once per API version, newest
  first (`metadata.resource.k8s.io/v1beta1`, then `v1alpha1` for older readers);
- the object names the claim (name, namespace, uid, generation 1), the pod claim name, and the
  request (its full `<request>/<subrequest>` reference) with each device: driver, pool, name and
  the attributes the device is published with (plus the UUID of a MIG device made for the claim);
- the file is bind-mounted read-only by the claim's CDI spec, on each device of the request, so a
  container sees it exactly when it sees the devices.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dradriver.names import dns_label_error
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.resourceclaim import POD_CLAIM_NAME_ANNOTATION

CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
#: Newest first: a reader takes the first object whose version it knows.
API_VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
KIND = "DeviceMetadata"
#: What a metadata file records, by base request name: one `DeviceMetadata` object each, without
#: apiVersion and kind (`encode` adds one of each version).
ClaimMetadata = dict[str, dict[str, Any]]


class MetadataError(ValueError):
    """A claim whose metadata cannot be placed: a name that is no path segment (one line, naming it)."""


@dataclass(frozen=True)
class DescribedDevice:
    """A prepared device as its metadata describes it."""

    pool: str
    name: str
    #: Request references as allocated (`request` or `request/subrequest`).
    requests: tuple[str, ...]
    #: The attributes it is published with (v1 JSON values), plus its UUID if it has one.
    attributes: Mapping[str, Mapping[str, Any]]


def base_request(reference: str) -> str:
    """`gpu/high-memory` -> `gpu`: the file is per top-level request."""
    return reference.partition("/")[0]


def check_names(claim: ClaimRef, pod_claim_name: str | None, requests: Sequence[str]) -> None:
    """MetadataError unless every name that becomes a path segment is a DNS label (the API server
    ensures it; a claim from a file may have anything)."""
    if pod_claim_name is not None and (err := dns_label_error(pod_claim_name)) is not None:
        raise MetadataError(
            f"claim {claim}: annotation {POD_CLAIM_NAME_ANNOTATION} {pod_claim_name!r}: {err}"
        )
    for reference in requests:
        if (err := dns_label_error(base_request(reference))) is not None:
            raise MetadataError(f"claim {claim}: request {reference!r}: {err}")


def render(
    claim: ClaimRef, pod_claim_name: str | None, driver_name: str, devices: Sequence[DescribedDevice]
) -> ClaimMetadata:
    """The claim's metadata, one object per base request its devices serve."""
    by_request: dict[str, dict[str, Any]] = {}
    for device in devices:
        entry = {
            "driver": driver_name,
            "pool": device.pool,
            "name": device.name,
            # At most 32 (v1beta1's limit), as a published device has at most 31 beside its memory.
            "attributes": dict(device.attributes),
        }
        for reference in device.requests:
            request = by_request.setdefault(base_request(reference), {"name": reference, "devices": []})
            request["devices"].append(entry)
    header: dict[str, Any] = {
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": 1}
    }
    if pod_claim_name is not None:
        header["podClaimName"] = pod_claim_name
    return {base: {**header, "requests": [request]} for base, request in by_request.items()}


def with_uuid(attributes: Mapping[str, Mapping[str, Any]], uuid: str) -> Mapping[str, Mapping[str, Any]]:
    """A device's published attributes with its UUID: a MIG device made at prepare has one only now."""
    if not uuid or attributes.get("uuid") == {"string": uuid}:
        return attributes
    return {"uuid": {"string": uuid}, **attributes}


def encode(obj: Mapping[str, Any]) -> bytes:
    """The file: the object once per API version, newest first, one JSON document a line. Keys
    sorted, so that the object as the checkpoint gives it back (sorted) encodes the same."""
    assert obj, "a metadata object names its claim"
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"))[1:]  # its fields after apiVersion, kind
    return b"".join(f'{{"kind":"{KIND}","apiVersion":"{v}",{body}\n'.encode() for v in API_VERSIONS)


def container_path(driver_name: str, claim_name: str, pod_claim_name: str | None, request: str) -> str:
    """Where the file of `request` appears in the containers."""
    place = (
        f"resourceclaims/{claim_name}"
        if pod_claim_name is None
        else f"resourceclaimtemplates/{pod_claim_name}"
    )
    return f"{CONTAINER_DIR}/{place}/{request}/{driver_name}-metadata.json"
