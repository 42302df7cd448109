"""What the gRPC layer needs from a DRA driver, independent of GPUs and of the wire version.

The v1 and v1beta1 DRAPlugin services are thin adapters over one `Driver`; everything here is
plain data so that drivers and their tests never touch protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it in NodePrepare/NodeUnprepare requests."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    """One device handed to the containers of a prepared claim."""

    pool_name: str
    device_name: str
    #: Requests (or `request/subrequest` references) served by this device; empty means all.
    request_names: tuple[str, ...]
    #: Fully qualified CDI device IDs the runtime injects.
    cdi_device_ids: tuple[str, ...]
    #: Consumable-capacity share, sent only on the v1 wire (Kubernetes >= 1.35).
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    """The outcome for one claim: devices, or a non-empty error that makes the kubelet retry."""

    devices: tuple[PreparedDevice, ...] = field(default=())
    error: str = ""


class CallError(Exception):
    """Fails a whole gRPC call rather than one claim, as the Go helper does when a claim
    cannot be fetched, is not allocated or was replaced; the kubelet retries the pod later."""


class Driver(Protocol):
    """Prepares and unprepares claims. Both must be idempotent and safe to call concurrently."""

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        """Results keyed by claim UID. Raises CallError to fail the whole call."""
        ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Error text keyed by claim UID ("" for success). Unknown claims succeed."""
        ...


def base_request_name(reference: str) -> str:
    """`gpu/h100` -> `gpu`: the kubelet matches containers' requests by base name only."""
    return reference.partition("/")[0]
