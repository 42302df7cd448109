"""`dradriver healthcheck`: an exec probe that asks the plugin's DRA socket over gRPC.

It calls the standard `grpc.health.v1.Health/Check` on the DRA socket: the answer comes from the
same gRPC server, threads and socket the kubelet uses, and is SERVING only while serve keeps
both of its sockets up. It prepares and unprepares nothing and serve logs nothing for it, so a
probe every few seconds costs no claim work and no log line.
"""

from __future__ import annotations

import argparse
from typing import Any

from dradriver.cli._common import (
    Command,
    add_driver_name_flag,
    add_plugins_dir_flag,
    add_pod_uid_flag,
    env_flag,
    positive_duration,
)

COMMAND = Command(
    help="probe a running `dradriver serve`: gRPC health check on its DRA socket (exit 0 if healthy)",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_driver_name_flag(parser)
    add_plugins_dir_flag(parser)
    add_pod_uid_flag(parser)  # the same env as serve's container: the same socket
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
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dradriver.plugin.server import dra_socket_name

    socket = args.kubelet_plugins_dir / args.driver_name / dra_socket_name(args.pod_uid)
    if not socket.exists():
        print(f"unhealthy: {socket} does not exist")
        return 1
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub: Any = health_pb2_grpc.HealthStub(channel)  # the stubs package omits the methods
            answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=args.timeout)
    except grpc.RpcError as err:
        print(f"unhealthy: health check on {socket}: {err.code().name}: {err.details()}")
        return 1
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        print(
            f"unhealthy: {socket} answers {health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)}"
        )
        return 1
    print(f"healthy: {socket} is serving")
    return 0
