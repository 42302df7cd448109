"""`dradriver healthcheck`: an exec probe that makes a real gRPC call on the plugin's DRA socket.

It sends NodeUnprepareResources with no claims, which a healthy plugin answers at once and which
changes nothing, so a liveness probe tests exactly what the kubelet depends on.
"""

from __future__ import annotations

import argparse
from typing import Any

from dradriver.cli._common import (
    add_command,
    add_driver_name_flag,
    add_plugins_dir_flag,
    env_flag,
    positive_duration,
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "healthcheck",
        help="probe a running `dradriver serve` with a real gRPC call on its DRA socket (exit 0 if healthy)",
        run=run,
    )
    add_driver_name_flag(parser)
    add_plugins_dir_flag(parser)
    env_flag(
        parser,
        "--timeout",
        type=positive_duration,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for the answer",
    )


def run(args: argparse.Namespace) -> int:
    import grpc

    from dradriver.kubeletclient import DRAClient

    socket = args.kubelet_plugins_dir / args.driver_name / "dra.sock"
    if not socket.exists():
        print(f"unhealthy: {socket} does not exist")
        return 1
    try:
        with DRAClient(socket) as client:
            response = client.unprepare([], timeout=args.timeout)
    except grpc.RpcError as err:
        print(f"unhealthy: NodeUnprepareResources on {socket}: {err.code().name}: {err.details()}")
        return 1
    if response.claims:
        print(f"unhealthy: NodeUnprepareResources on {socket} answered claims nobody asked for")
        return 1
    print(f"healthy: {socket} answered NodeUnprepareResources")
    return 0
