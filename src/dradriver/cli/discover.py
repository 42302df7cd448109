"""`dradriver discover`: the node's GPUs as the devices we publish, with the hardware behind them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Literal

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.cli._common import (
    CLIError,
    Command,
    add_driver_root_flags,
    add_fake_gpus_flag,
    add_output_flag,
    add_partitionable_flag,
    driver_root_mount,
)

if TYPE_CHECKING:
    from dradriver.devicemodel import DeviceSet, Hardware
    from dradriver.discovery import NodeInventory


COMMAND = Command(
    help="list the node's GPUs and MIG devices with the attributes they are published with",
    description="Discover GPUs through NVML (or a fake profile) and show each device as it would be "
    "published: name, attributes, capacities, plus the hardware it maps to (device nodes, MIG "
    "instance ids). GPUs NVML could not read are listed as skipped.",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_fake_gpus_flag(parser)
    add_driver_root_flags(parser)
    add_partitionable_flag(parser)
    add_output_flag(parser)


def hardware_facts(hardware: Hardware) -> dict[str, Any]:
    """What prepare needs to know about the hardware behind a device, for humans and scripts."""
    from dradriver.devicemodel import PossibleMig
    from dradriver.discovery import NVIDIA_CHAR_MAJOR, Gpu

    if isinstance(hardware, Gpu):
        return {
            "kind": "gpu",
            "index": hardware.index,
            "minor": hardware.minor,
            "deviceNode": f"/dev/nvidia{hardware.minor}",
            "charDevice": f"{NVIDIA_CHAR_MAJOR}:{hardware.minor}",
        }
    if isinstance(hardware, PossibleMig):
        return {
            "kind": "mig-placement",
            "parentMinor": hardware.parent.minor,
            "profile": hardware.profile.name,
            "placement": {"start": hardware.placement.start, "size": hardware.placement.size},
            "createdOn": "prepare",
        }
    caps = [minor for minor in (hardware.gi_caps_minor, hardware.ci_caps_minor) if minor is not None]
    return {
        "kind": "mig",
        "parentMinor": hardware.parent_minor,
        "gpuInstance": hardware.gi_id,
        "computeInstance": hardware.ci_id,
        "placement": {"start": hardware.placement.start, "size": hardware.placement.size},
        "deviceNodes": [
            f"/dev/nvidia{hardware.parent_minor}",
            *(f"/dev/nvidia-caps/nvidia-cap{m}" for m in caps),
        ],
    }


def report(inventory: NodeInventory, devices: DeviceSet) -> dict[str, Any]:
    """The JSON/YAML form of `discover`."""
    out: dict[str, Any] = {
        "driverVersion": inventory.driver_version,
        "cudaDriverVersion": inventory.cuda_driver_version,
        "nvidiaCapsMajor": inventory.nvidia_caps_major,
        "devices": [
            {**device.json, "hardware": hardware_facts(device.hardware)} for device in devices.devices
        ],
    }
    if devices.counter_sets:
        out["counterSets"] = list(devices.counter_sets)
    out["skipped"] = [{"index": s.index, "reason": s.reason} for s in inventory.skipped]
    out["warnings"] = list(devices.warnings)
    return out


_UNLIMITED = 10_000


def _value(attribute: dict[str, Any] | None) -> str:
    return "" if attribute is None else str(next(iter(attribute.values())))


def _print_table(inventory: NodeInventory, devices: DeviceSet) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"NVIDIA driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for column in ("DEVICE", "TYPE", "PRODUCT", "PROFILE", "MEMORY", "COMPUTE", "PCI BUS", "NUMA", "UUID"):
        # Names never wrap; UUIDs are cut first when the terminal is narrow (-o json has them whole).
        wrap: Literal["ellipsis", "fold"] = "ellipsis" if column == "UUID" else "fold"
        table.add_column(column, min_width=len(column), no_wrap=column in {"DEVICE", "UUID"}, overflow=wrap)
    for device in devices.devices:
        attrs = device.json["attributes"]
        table.add_row(
            device.name,
            _value(attrs.get("type")),
            _value(attrs.get("productName")),
            _value(attrs.get("profile")),
            device.json["capacity"]["memory"]["value"],
            _value(attrs.get("cudaComputeCapability")),
            _value(attrs.get("resource.kubernetes.io/pciBusID")),
            _value(attrs.get("numaNode")),
            _value(attrs.get("uuid")),
        )
    console = Console()
    if not console.is_terminal:  # piped output is read by people too: never squeeze it into 80 columns
        console = Console(width=Console(width=_UNLIMITED).measure(table).maximum)
    console.print(table)
    if not devices.devices:
        console.print("no GPUs found")
    errors = Console(stderr=True)
    for skipped in inventory.skipped:
        errors.print(f"skipped GPU {skipped.index}: {skipped.reason}", markup=False)
    for warning in devices.warnings:
        errors.print(f"warning: {warning}", markup=False)


def run(args: argparse.Namespace) -> int:
    from dradriver.backend.select import open_backend
    from dradriver.cli._output import write_document
    from dradriver.devicemodel import build_devices
    from dradriver.discovery import DiscoveryError

    try:
        library = open_backend(args.fake_gpus, driver_root=driver_root_mount(args))
        try:
            inventory = library.discover()
        finally:
            library.close()
    except DiscoveryError as err:
        raise CLIError(str(err)) from None
    # Attribute names are bare (the driver's domain), so the driver name does not change them.
    devices = build_devices(inventory, driver_name=DEFAULT_DRIVER_NAME, partitionable=args.partitionable)
    if args.output == "table":
        _print_table(inventory, devices)
    else:
        write_document(report(inventory, devices), args.output)
    return 0
