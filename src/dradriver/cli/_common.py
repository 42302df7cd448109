"""Building blocks shared by the subcommands: the parser class, env-backed flags, CLI errors.

Every flag `--some-flag` can also be set with the environment variable `DRADRIVER_SOME_FLAG`
(a DaemonSet sets flags through env more often than through args); an explicit flag wins.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.names import dns_subdomain_error, driver_name_error

ENV_PREFIX = "DRADRIVER_"


class CLIError(Exception):
    """Bad input or a failed precondition: printed as one line, exit code 2, never a traceback."""

    exit_code = 2


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def env_name(flag: str) -> str:
    """`--kubelet-plugins-dir` -> `DRADRIVER_KUBELET_PLUGINS_DIR`."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def env_flag(
    parser: argparse.ArgumentParser,
    *flags: str,
    help: str,
    default: Any = None,
    type: Callable[[str], Any] = str,
    fallback_env: Sequence[str] = (),
    **kwargs: Any,
) -> None:
    """Add a flag whose default comes from DRADRIVER_<FLAG> (then `fallback_env`, then `default`)."""
    long_flag = next(f for f in flags if f.startswith("--"))
    names = [env_name(long_flag), *fallback_env]
    from_env = next((os.environ[n] for n in names if os.environ.get(n)), None)
    shown = f"; default {default}" if default not in (None, "", False) else ""
    parser.add_argument(
        *flags,
        type=type,
        default=type(from_env) if from_env is not None else default,
        help=f"{help} (env {' or '.join(names)}{shown})",
        **kwargs,
    )


def env_switch(parser: argparse.ArgumentParser, flag: str, *, help: str) -> None:
    """A boolean flag; DRADRIVER_<FLAG>=true|1|yes turns it on."""
    name = env_name(flag)
    on = os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
    parser.add_argument(flag, action="store_true", default=on, help=f"{help} (env {name})")


def driver_name(value: str) -> str:
    """argparse type for --driver-name."""
    if (err := driver_name_error(value)) is not None:
        raise argparse.ArgumentTypeError(f"invalid driver name {value!r}: {err}")
    return value


def absolute_path(value: str) -> Path:
    """argparse type for directories the kubelet and runtime must see at the same path."""
    return Path(value).absolute()


def add_logging_flags(parser: argparse.ArgumentParser, default_format: str) -> None:
    env_flag(
        parser,
        "--log-format",
        choices=["json", "console"],
        default=default_format,
        help="log output format",
    )
    env_flag(
        parser,
        "-v",
        "--verbosity",
        type=int,
        default=0,
        metavar="N",
        help="log verbosity: 4 adds debug events, 6 every gRPC request and response",
    )


def add_driver_name_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(parser, "--driver-name", type=driver_name, default=DEFAULT_DRIVER_NAME, help="DRA driver name")


def add_plugins_dir_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--kubelet-plugins-dir",
        type=absolute_path,
        default=Path("/var/lib/kubelet/plugins"),
        help="kubelet plugins directory; the DRA socket is <dir>/<driver>/dra.sock",
    )


def pod_uid(value: str) -> str:
    """argparse type for --pod-uid: it becomes part of socket and lock file names."""
    from dradriver.names import uid_error

    if value and (err := uid_error(value)) is not None:
        raise argparse.ArgumentTypeError(f"invalid pod UID {value!r}: {err}")
    return value


def add_pod_uid_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--pod-uid",
        type=pod_uid,
        default="",
        metavar="UID",
        help="this pod's UID (downward API metadata.uid): turns on rolling updates, two instances side "
        "by side during a surge rollout, with sockets <driver>-<UID>-reg.sock and dra-<UID>.sock "
        "(kubelet 1.33 or later)",
    )


def add_state_dir_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--state-dir",
        type=absolute_path,
        help="the plugin's state directory: checkpoint, health.json, the fake-event log "
        "(default <kubelet-plugins-dir>/<driver-name>)",
    )


def state_dir(args: argparse.Namespace) -> Path:
    """--state-dir, else its default under the plugins directory (needs add_plugins_dir_flag too)."""
    path: Path = args.state_dir or args.kubelet_plugins_dir / args.driver_name
    return path


def add_fake_gpus_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--fake-gpus",
        metavar="PROFILE|FILE",
        help="use the built-in fake GPU backend with this profile name or profile YAML file instead of NVML",
    )


def add_driver_root_flags(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--driver-root",
        type=absolute_path,
        default=Path("/"),
        help="the host driver's root on the host (/run/nvidia/driver with the GPU operator)",
    )
    env_flag(
        parser,
        "--driver-root-mount",
        type=absolute_path,
        help="where --driver-root is mounted inside this container (default: the same path); "
        "NVML is loaded from there",
    )


def driver_root_mount(args: argparse.Namespace) -> Path:
    """Where this process sees the driver root (needs add_driver_root_flags)."""
    path: Path = args.driver_root_mount or args.driver_root
    return path


def print_error(prog: str, message: str) -> None:
    print(f"{prog}: error: {message}", file=sys.stderr)


def add_command(
    subparsers: Any,
    name: str,
    *,
    help: str,
    run: Callable[[argparse.Namespace], int],
    description: str | None = None,
    log_format: str = "console",
    defer_logging: bool = False,
) -> argparse.ArgumentParser:
    """Create a subcommand parser with the shared logging flags.

    `defer_logging` leaves logging to the command itself (serve configures it only once its
    sockets are up, because importing structlog is slow).
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help, description=description or help, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_logging_flags(parser, log_format)
    parser.set_defaults(run=run, prog=parser.prog, defer_logging=defer_logging)
    return parser


def node_name(value: str) -> str:
    """argparse type for --node-name: the API server checks node names as DNS subdomains."""
    if (err := dns_subdomain_error(value)) is not None:
        raise argparse.ArgumentTypeError(f"invalid node name {value!r}: {err}")
    return value


def add_node_name_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--node-name",
        type=node_name,
        default=socket.gethostname().lower(),
        fallback_env=["NODE_NAME"],
        help="node name, also the pool name",
    )


def add_partitionable_flag(parser: argparse.ArgumentParser) -> None:
    env_switch(
        parser,
        "--partitionable",
        help="publish full GPUs plus every possible MIG placement of MIG-enabled GPUs, consuming shared "
        "counters (Kubernetes >= 1.35 with the DRAPartitionableDevices feature gate)",
    )


def add_kubeconfig_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--kubeconfig",
        help="kubeconfig file (default: in-cluster config, then $KUBECONFIG, then ~/.kube/config)",
    )


def cluster_client(kubeconfig: str | None) -> Any:
    """A KubeClient for a command that cannot work without a cluster; one-line errors otherwise."""
    from dradriver.kube import KubeError, load_client

    try:
        client = load_client(kubeconfig)
    except KubeError as err:
        raise CLIError(str(err)) from None
    if client is None:
        raise CLIError("no Kubernetes API access: pass --kubeconfig or set KUBECONFIG")
    return client
