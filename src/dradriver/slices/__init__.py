"""ResourceSlices: rendering a node's devices into slices, and the upstream-limits validator.

`render_node_slices` is the one pipeline from a device set to the slices of the node's pool
(render, then `validate_node_pool`): `serve` publishes what it returns, and `dradriver slices`,
the CEL tools' --fake-gpus and the demo get it through `build_node_slices` (discover -> device
model -> render_node_slices). It raises `InvalidSlicesError` instead of returning anything the
API server or the scheduler would reject.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver.nodescan import scan_node
from dradriver.slices.compare import dropped_gates, stored_differences
from dradriver.slices.render import render_slices, slice_name_prefix
from dradriver.slices.validate import Finding, validate_node_pool, validate_slice, validate_slices

if TYPE_CHECKING:
    from dradriver.devicemodel import DeviceSet
    from dradriver.devicemodel.shares import SharePolicy

__all__ = [
    "Finding",
    "InvalidSlicesError",
    "build_node_slices",
    "render_node_slices",
    "render_slices",
    "slice_name_prefix",
    "dropped_gates",
    "stored_differences",
    "validate_node_pool",
    "validate_slice",
    "validate_slices",
]


class InvalidSlicesError(Exception):
    """Rendered slices that fail validation; `findings` says where and why."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
        super().__init__(f"rendered ResourceSlices are invalid: {findings[0]}{more}")


def build_node_slices(
    fake_gpus: str | None,
    *,
    node_name: str,
    driver_name: str,
    partitionable: bool = False,
    driver_root: Path | None = None,
    shares: SharePolicy | None = None,
) -> list[dict[str, Any]]:
    """Discover the node's GPUs and return the validated slices `serve` would publish.

    Devices discovery skipped and values the device model had to change or leave out are
    logged as warnings. Raises DiscoveryError (no GPUs can be discovered) or InvalidSlicesError.
    """
    scan = scan_node(
        fake_gpus,
        driver_name=driver_name,
        partitionable=partitionable,
        driver_root=driver_root,
        shares=shares,
        component="slices",
    )
    return render_node_slices(scan.devices, node_name=node_name, driver_name=driver_name)


def render_node_slices(device_set: DeviceSet, *, node_name: str, driver_name: str) -> list[dict[str, Any]]:
    """The validated slices of the node's pool; InvalidSlicesError if any rule fails."""
    slices = render_slices(device_set, node_name=node_name, driver_name=driver_name)
    if findings := validate_node_pool(slices, driver=driver_name, node=node_name):
        raise InvalidSlicesError(findings)
    return slices
