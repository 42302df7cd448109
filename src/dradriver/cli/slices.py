"""`dradriver slices`: the exact ResourceSlices `serve` would publish for this node, without a cluster."""

from __future__ import annotations

import argparse
import sys

from dradriver.cli._common import (
    CLIError,
    add_command,
    add_driver_name_flag,
    add_driver_root_flags,
    add_fake_gpus_flag,
    add_kubeconfig_flag,
    add_node_name_flag,
    add_partitionable_flag,
    cluster_client,
    driver_root_mount,
    env_flag,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_command(
        subparsers,
        "slices",
        help="print the ResourceSlices this node would publish (no cluster needed)",
        description="Discover the node's GPUs (or a fake profile) and print the ResourceSlice objects "
        "`dradriver serve` would publish, after checking them against the API server's rules. "
        "Exits 1 with the findings if any slice would be rejected.",
        run=run,
    )
    add_fake_gpus_flag(parser)
    add_driver_root_flags(parser)
    add_node_name_flag(parser)
    add_driver_name_flag(parser)
    add_partitionable_flag(parser)
    env_flag(parser, "-o", "--output", choices=["yaml", "json"], default="yaml", help="output format")
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
        )
    except DiscoveryError as err:
        raise CLIError(str(err)) from None
    except InvalidSlicesError as err:
        print(f"{args.prog}: error: {len(err.findings)} problem(s) in the rendered slices:", file=sys.stderr)
        for finding in err.findings:
            print(f"  {finding}", file=sys.stderr)
        return 1
    sys.stdout.write(dump_json(slices) if args.output == "json" else dump_yaml_documents(slices))
    return 0


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
