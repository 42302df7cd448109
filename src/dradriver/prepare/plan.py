"""From an allocated ResourceClaim to what this node must prepare: pure, no I/O.

Only results of our driver count (a claim may mix drivers); each must be in this node's pool and
name a device we publish. Results for the same device (several requests, or one device serving a
request and its subrequest) become one prepared device. Opaque configs decide the sharing of each
device: class configs first, claim configs override, scoped by request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dradriver.devicemodel import PossibleMig
from dradriver.discovery import Gpu, MigDevice
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.config import (
    ConfigError,
    DeviceConfig,
    GpuConfig,
    MigDeviceConfig,
    ScopedConfig,
    Sharing,
    effective,
    our_configs,
)
from dradriver.prepare.resourceclaim import AllocationResult, DeviceAllocation, ResourceClaim

Hardware = Gpu | MigDevice
#: What the device model publishes under a name: hardware, or a MIG placement (--partitionable).
Published = Gpu | MigDevice | PossibleMig


class PlanError(Exception):
    """This claim cannot be prepared here; the message is the per-claim error the kubelet shows."""


@dataclass(frozen=True)
class PlannedDevice:
    name: str
    pool: str
    hardware: Hardware
    #: Request references as allocated (may contain `/subrequest`; the gRPC layer strips them).
    requests: tuple[str, ...]
    admin_access: bool
    share_id: str | None
    sharing: Sharing | None

    @property
    def uuid(self) -> str:
        return self.hardware.uuid


@dataclass(frozen=True)
class ClaimPlan:
    claim: ClaimRef
    devices: tuple[PlannedDevice, ...]


def plan_claim(
    claim: ResourceClaim,
    ref: ClaimRef,
    *,
    driver_name: str,
    pool_name: str,
    devices: Mapping[str, Published],
) -> ClaimPlan:
    allocation = claim.status.allocation
    allocated = allocation.devices if allocation is not None else DeviceAllocation()
    try:
        configs = our_configs(allocated.config, driver_name)
    except ConfigError as err:
        raise PlanError(f"claim {ref}: invalid opaque config: {err}") from None

    grouped: dict[tuple[str, str | None], list[AllocationResult]] = {}
    for result in allocated.results:
        if result.driver != driver_name:
            continue
        if result.pool != pool_name:
            raise PlanError(
                f"claim {ref}: request {result.request!r} was allocated device "
                f"{result.device!r} in pool {result.pool!r}, "
                f"but this node's pool is {pool_name!r}"
            )
        if result.device not in devices:
            raise PlanError(
                f"claim {ref}: request {result.request!r} was allocated device "
                f"{result.device!r}, which this node does not have"
            )
        grouped.setdefault((result.device, result.share_id), []).append(result)

    planned = [
        _plan_device(
            ref,
            name,
            share_id,
            results,
            hardware=_hardware(ref, name, devices[name]),
            pool=pool_name,
            configs=configs,
        )
        for (name, share_id), results in grouped.items()
    ]
    return ClaimPlan(claim=ref, devices=tuple(planned))


def _hardware(ref: ClaimRef, name: str, published: Published) -> Hardware:
    if not isinstance(published, PossibleMig):
        return published
    if published.existing is None:
        raise PlanError(
            f"claim {ref}: MIG device {name} does not exist on the GPU yet, and dradriver does not create "
            "MIG devices on demand; create the partitions first (nvidia-smi mig, mig-parted)"
        )
    return published.existing


def _plan_device(
    ref: ClaimRef,
    name: str,
    share_id: str | None,
    results: Sequence[AllocationResult],
    *,
    pool: str,
    hardware: Hardware,
    configs: Sequence[ScopedConfig],
) -> PlannedDevice:
    requests = tuple(dict.fromkeys(r.request for r in results))
    kind: type[DeviceConfig] = MigDeviceConfig if isinstance(hardware, MigDevice) else GpuConfig
    for scoped in configs:
        if (
            scoped.requests
            and not isinstance(scoped.config, kind)
            and any(scoped.applies_to(r) for r in requests)
        ):
            device_type = "MIG device" if isinstance(hardware, MigDevice) else "GPU"
            raise PlanError(
                f"claim {ref}: a {scoped.config.kind} config names request(s) {list(scoped.requests)}, "
                f"but {name} serving them is a {device_type}; use {kind.__name__}"
            )
    chosen = {id(c): c for c in (effective(configs, r, kind) for r in requests) if c is not None}
    if len(chosen) > 1:
        raise PlanError(f"claim {ref}: requests {list(requests)} give device {name} conflicting configs")
    config = next(iter(chosen.values()), None)
    return PlannedDevice(
        name=name,
        pool=pool,
        hardware=hardware,
        requests=requests,
        admin_access=all(bool(r.admin_access) for r in results),
        share_id=share_id,
        sharing=config.sharing if config is not None else None,
    )
