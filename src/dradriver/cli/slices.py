"""`dradriver slices`: the exact ResourceSlices `serve` would publish for this node, without a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dradriver.cli._common import (
    CLIError,
    Command,
    add_device_flags,
    add_driver_name_flag,
    add_kubeconfig_flag,
    add_node_name_flag,
    add_output_flag,
    cluster_client,
    driver_root_mount,
    share_policy,
)

COMMAND = Command(
    help="print the ResourceSlices this node would publish (no cluster needed)",
    description="Discover the node's GPUs (or a fake profile) and print the ResourceSlice objects "
    "`dradriver serve` would publish, after checking them against the API server's rules. "
    "Exits 1 with the findings if any slice would be rejected.",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_device_flags(parser)
    add_node_name_flag(parser)
    add_driver_name_flag(parser)
    add_output_flag(parser, default="yaml")
    parser.add_argument(
        "--delete",
        action="store_true",
        help="delete this driver's ResourceSlices of --node-name from the API server instead "
        "(serve leaves them in place on shutdown; the kubelet removes them 30 s after a driver is gone)",
    )
    add_kubeconfig_flag(parser)


def run(args: argparse.Namespace) -> int:
    if args.delete:
        return _delete(args)
    from dradriver.cli._output import dump_json, dump_yaml_documents
    from dradriver.discovery import DiscoveryError
    from dradriver.slices import InvalidSlicesError, build_node_slices

    try:
        slices = build_node_slices(
            args.fake_gpus,
            node_name=args.node_name,
            driver_name=args.driver_name,
            partitionable=args.partitionable,
            driver_root=driver_root_mount(args),
            shares=share_policy(args),
        )
    except DiscoveryError as err:
        raise CLIError(str(err)) from None
    except InvalidSlicesError as err:
        print(f"{args.prog}: error: {len(err.findings)} problem(s) in the rendered slices:", file=sys.stderr)
        for finding in err.findings:
            print(f"  {finding}", file=sys.stderr)
        return 1
    if args.output == "table":
        _print_table(slices)
    else:  # YAML as `kubectl create -f` reads it: one document per slice
        sys.stdout.write(dump_json(slices) if args.output == "json" else dump_yaml_documents(slices))
    return 0


def _print_table(slices: list[dict[str, Any]]) -> None:
    from rich import box
    from rich.table import Table

    from dradriver.cli._render import console

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("SLICE", "DEVICE", "TYPE", "PRODUCT / PROFILE", "TAINTS"):
        table.add_column(column, no_wrap=column in ("SLICE", "DEVICE", "TYPE"), overflow="fold")
    for slice_ in slices:
        spec = slice_["spec"]
        index = str(slice_["metadata"].get("generateName", "")).split("-", 1)[0]
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            kind = next(iter((attributes.get("type") or {"": ""}).values()))
            product = attributes.get("profile") or attributes.get("productName") or {}
            taints = ", ".join(f"{t.get('key')}:{t.get('effect')}" for t in device.get("taints") or [])
            table.add_row(index, device["name"], str(kind), str(next(iter(product.values()), "")), taints)
        for counter_set in spec.get("sharedCounters") or []:
            table.add_row(
                index,
                f"counters {counter_set['name']}",
                "",
                f"{len(counter_set.get('counters', {}))} counters",
                "",
            )
    out = console()
    node = slices[0]["spec"]["nodeName"] if slices else "?"
    out.print(f"{len(slices)} ResourceSlice(s) for node {node}; the full objects: -o yaml", markup=False)
    out.print(table)


def _delete(args: argparse.Namespace) -> int:
    from dradriver.kube import KubeError
    from dradriver.publish import delete_node_slices

    client = cluster_client(args.kubeconfig)
    try:
        deleted = delete_node_slices(client, driver_name=args.driver_name, node_name=args.node_name)
    except KubeError as err:
        raise CLIError(f"deleting ResourceSlices of node {args.node_name}: {err}") from None
    print(f"deleted {deleted} ResourceSlice(s) of driver {args.driver_name} on node {args.node_name}")
    return 0
