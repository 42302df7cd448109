"""One look at the node: discover its GPUs, build the device model, log what had to be left out.

The one "discover -> devices -> warnings" step, for `serve` (at start-up and at each rescan of
the live inventory) and for `dradriver slices` and the tools built on `build_node_slices`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from dradriver import logs
from dradriver.backend.interface import GpuBackend
from dradriver.backend.select import open_backend
from dradriver.devicemodel import DeviceSet, GpuInstance, build_devices
from dradriver.devicemodel.shares import SharePolicy
from dradriver.discovery import NodeInventory


@dataclass(frozen=True)
class NodeScan:
    #: The backend the scan used, closed; the parts it makes (health source, MIG control,
    #: sharing, telemetry) hold their own resources.
    backend: GpuBackend
    inventory: NodeInventory
    devices: DeviceSet


def scan_node(
    fake_gpus: str | None,
    *,
    driver_name: str,
    partitionable: bool,
    driver_root: Path | None = None,
    proc_root: Path = Path("/proc"),
    created: Collection[GpuInstance] = frozenset(),
    shares: SharePolicy | None = None,
    component: str | None,
) -> NodeScan:
    """Discover and build the device set; `created` names the GPU instances dradriver made
    (published as their placements with --partitionable); `shares`, the GPUs published as
    shareable (--gpu-shares). GPUs discovery skipped and values the
    device model had to change or leave out are logged as warnings of `component` (None: not
    logged, as at a rescan that would repeat them).

    Raises DiscoveryError when no GPUs can be discovered.
    """
    backend = open_backend(fake_gpus, driver_root=driver_root, proc_root=proc_root)
    try:
        inventory = backend.discover()
    finally:
        backend.close()
    devices = build_devices(
        inventory,
        driver_name=driver_name,
        partitionable=partitionable,
        created=created if partitionable else frozenset(),
        shares=shares,
    )
    if component is not None:
        log = logs.get_logger(component=component)
        for skipped in inventory.skipped:
            log.warning("GPU skipped", index=skipped.index, reason=skipped.reason)
        for warning in devices.warnings:
            log.warning("device model", reason=warning)
    return NodeScan(backend, inventory, devices)
