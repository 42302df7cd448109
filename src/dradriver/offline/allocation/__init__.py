"""Allocation simulator: would the scheduler allocate these claims, and why (not)?

Pure logic: callers parse objects with `parse_device_class`, `parse_claim` and `parse_slice`
(v1, v1beta2 and v1beta1 shapes) and call `simulate`.
"""

from dradriver.offline.allocation.model import (
    AllocatedDevice,
    Claim,
    Device,
    DeviceClass,
    DeviceRequest,
    InputError,
    MatchAttribute,
    Request,
    Slice,
    api_version_of,
    parse_claim,
    parse_device_class,
    parse_slice,
)
from dradriver.offline.allocation.simulator import (
    ClaimReport,
    DeviceVerdict,
    NodeReport,
    RequestReport,
    SelectorOutcome,
    Simulation,
    simulate,
)

__all__ = [
    "AllocatedDevice",
    "Claim",
    "ClaimReport",
    "Device",
    "DeviceClass",
    "DeviceRequest",
    "DeviceVerdict",
    "InputError",
    "MatchAttribute",
    "NodeReport",
    "Request",
    "RequestReport",
    "SelectorOutcome",
    "Simulation",
    "Slice",
    "api_version_of",
    "parse_claim",
    "parse_device_class",
    "parse_slice",
    "simulate",
]
