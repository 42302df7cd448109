"""From an allocated ResourceClaim to what this node must prepare: pure, no I/O.

Only results of our driver count (a claim may mix drivers); each must be in this node's pool and
name a device we publish. Results for the same device (several requests, or one device serving a
request and its subrequest) become one prepared device; a MIG placement (--partitionable) is
planned as itself, and prepare creates its MIG device. Opaque configs decide the sharing of each
device: class configs first, claim configs override, scoped by request. A config that would
share nothing of this claim (a GpuConfig on MIG devices only, or the reverse) is an error, never
silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dradriver.devicemodel import Hardware, PossibleMig
from dradriver.discovery import Gpu
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
from dradriver.prepare.gpu_shares import PlannedShare, ShareError, ShareLimits, check_shares, share_limits
from dradriver.prepare.resourceclaim import AllocationResult, DeviceAllocation, ResourceClaim


class PlanError(Exception):
    """This claim cannot be prepared here; the message is the per-claim error the kubelet shows."""


@dataclass(frozen=True)
class PlannedDevice:
    name: str
    pool: str
    #: A MIG placement until prepare has created its MIG device.
    hardware: Hardware
    #: Request references as allocated (may contain `/subrequest`; the gRPC layer strips them).
    requests: tuple[str, ...]
    admin_access: bool
    share_id: str | None
    sharing: Sharing | None
    #: A share's MPS client limits, from what the scheduler recorded it consumes.
    share: ShareLimits | None = None

    @property
    def uuid(self) -> str:
        """The GPU or MIG device UUID; empty for a MIG device not created yet."""
        return "" if isinstance(self.hardware, PossibleMig) else self.hardware.uuid


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
    devices: Mapping[str, Hardware],
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
            hardware=devices[name],
            pool=pool_name,
            configs=configs,
        )
        for (name, share_id), results in grouped.items()
    ]
    _check_every_sharing_config_applies(ref, configs, planned)
    try:
        check_shares(str(ref), [PlannedShare(d.name, d.share_id, d.sharing is not None) for d in planned])
    except ShareError as err:
        raise PlanError(str(err)) from None
    return ClaimPlan(claim=ref, devices=tuple(planned))


def _config_kind(hardware: Hardware) -> type[DeviceConfig]:
    return GpuConfig if isinstance(hardware, Gpu) else MigDeviceConfig


def _check_every_sharing_config_applies(
    ref: ClaimRef, configs: Sequence[ScopedConfig], planned: Sequence[PlannedDevice]
) -> None:
    """A sharing setting that reaches none of the devices it was meant for is an error."""
    for scoped in configs:
        if scoped.config.sharing is None:
            continue
        meant = [d for d in planned if any(scoped.applies_to(r) for r in d.requests)]
        if meant and not any(_config_kind(d.hardware) is type(scoped.config) for d in meant):
            other = _config_kind(meant[0].hardware).__name__
            kinds = "MIG devices" if other == "MigDeviceConfig" else "full GPUs"
            raise PlanError(
                f"claim {ref}: a {scoped.config.kind} with {scoped.config.sharing.strategy} applies to "
                f"{', '.join(d.name for d in meant)}, which are {kinds}, so it would do nothing; use {other}"
            )


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
    kind = _config_kind(hardware)
    for scoped in configs:
        if (
            scoped.requests
            and not isinstance(scoped.config, kind)
            and any(scoped.applies_to(r) for r in requests)
        ):
            device_type = "GPU" if isinstance(hardware, Gpu) else "MIG device"
            raise PlanError(
                f"claim {ref}: a {scoped.config.kind} config names request(s) {list(scoped.requests)}, "
                f"but {name} serving them is a {device_type}; use {kind.__name__}"
            )
    chosen = {id(c): c for c in (effective(configs, r, kind) for r in requests) if c is not None}
    if len(chosen) > 1:
        raise PlanError(f"claim {ref}: requests {list(requests)} give device {name} conflicting configs")
    config = next(iter(chosen.values()), None)
    limits = None
    if share_id is not None:
        try:
            limits = share_limits(f"claim {ref}: device {name}", results[0].consumed_capacity)
        except ShareError as err:
            raise PlanError(str(err)) from None
    return PlannedDevice(
        name=name,
        pool=pool,
        hardware=hardware,
        requests=requests,
        admin_access=all(bool(r.admin_access) for r in results),
        share_id=share_id,
        sharing=config.sharing if config is not None else None,
        share=limits,
    )
