"""`dradriver serve`: the kubelet plugin daemon."""

from __future__ import annotations

import argparse
from pathlib import Path

from dradriver.cli._common import (
    CLIError,
    Command,
    absolute_path,
    add_device_flags,
    add_driver_name_flag,
    add_kubeconfig_flag,
    add_node_name_flag,
    add_plugins_dir_flag,
    add_pod_uid_flag,
    add_state_dir_flag,
    boolean,
    driver_root_mount,
    duration,
    env_flag,
    env_switch,
    existing_directory,
    percent,
    share_policy,
    state_dir,
)
from dradriver.plugin.node_instances import DEFAULT_NODE_LOCK_DIR

#: Default of --rescan-interval.
DEFAULT_RESCAN_SECONDS = 30.0
#: Default of --telemetry-interval: a scrape every 15 s sees readings at most this old.
DEFAULT_TELEMETRY_SECONDS = 5.0


COMMAND = Command(
    help="run the kubelet plugin: register with the kubelet, serve DRA gRPC, publish ResourceSlices",
    log_format="json",
    defer_logging=True,
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_driver_name_flag(parser)
    add_node_name_flag(parser)
    add_pod_uid_flag(parser)
    env_flag(
        parser,
        "--kubelet-registry-dir",
        type=absolute_path,
        default=Path("/var/lib/kubelet/plugins_registry"),
        help="directory the kubelet watches for registration sockets",
    )
    add_plugins_dir_flag(parser)
    env_flag(
        parser,
        "--cdi-dir",
        type=absolute_path,
        default=Path("/var/run/cdi"),
        help="where CDI specs are written",
    )
    add_state_dir_flag(parser)
    add_kubeconfig_flag(parser)
    env_flag(
        parser,
        "--claims-dir",
        type=existing_directory,
        metavar="DIR",
        help="read ResourceClaims from the YAML/JSON files in DIR instead of the API server "
        "(node-only set-ups, the demo and tests)",
    )
    add_device_flags(parser)
    env_flag(
        parser,
        "--node-lock-dir",
        type=absolute_path,
        default=DEFAULT_NODE_LOCK_DIR,
        metavar="DIR",
        help="the host directory (root-only, made 0700) of the node-wide lock that keeps a second "
        "instance of the driver with cluster access off the node whatever its other directories; "
        "every DaemonSet of the driver must mount the same host directory here",
    )
    env_flag(
        parser,
        "--proc-root",
        type=absolute_path,
        default=Path("/proc"),
        help="the host's /proc: the host driver's files (/proc/devices, /proc/driver/nvidia-caps) and, "
        "for the telemetry, the cgroups of the processes on the GPUs",
    )
    env_flag(
        parser,
        "--host-dev",
        type=absolute_path,
        default=Path("/dev"),
        help="where the host's /dev is mounted in this container: a device node a claim's CDI spec "
        "names (/dev/nvidia-uvm, /dev/nvidia-caps/*) is created there when the host driver has not yet",
    )
    env_flag(
        parser,
        "--stale-claim-grace",
        type=duration,
        default=300.0,
        metavar="SECONDS",
        help="unprepare a prepared claim once its ResourceClaim has been gone from the API server this long",
    )
    env_flag(
        parser,
        "--rescan-interval",
        type=non_negative,
        default=DEFAULT_RESCAN_SECONDS,
        metavar="SECONDS",
        help="scan the node's GPUs again this often (GPUs, MIG devices, host driver version) and "
        "republish what changed; 0 scans only on events (NVML MIG changes, a rewritten --fake-gpus file)",
    )
    env_flag(
        parser,
        "--shutdown-grace",
        type=duration,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long in-flight calls may take to finish; the process is gone "
        "within this plus one second, whatever is still running",
    )
    env_flag(
        parser,
        "--metrics-address",
        type=probe_address,
        metavar="[HOST]:PORT",
        help="serve /healthz and /readyz (and /metrics) here, e.g. 127.0.0.1:8080; off when unset",
    )
    env_flag(
        parser,
        "--metrics-tenant-labels",
        type=boolean,
        default=True,
        metavar="true|false",
        help="label device series with the claim and pods holding the device (claim_namespace, "
        "claim_name, claim_uid, pods) and serve per-pod and per-claim series; false leaves every "
        "tenant's names out of /metrics",
    )
    env_flag(
        parser,
        "--telemetry-interval",
        type=duration,
        default=DEFAULT_TELEMETRY_SECONDS,
        metavar="SECONDS",
        help="read every device's utilisation, memory, power and the like this often for /metrics "
        "(with --metrics-address; 0: no device telemetry)",
    )
    env_flag(
        parser,
        "--idle-threshold",
        type=percent,
        metavar="PERCENT",
        help="with --idle-window: a prepared claim whose devices all stay below this SM utilisation "
        "gets an Event (on the claim and its pods) and a dradriver_claim_idle_seconds series; off when unset",
    )
    env_flag(
        parser,
        "--idle-window",
        type=duration,
        metavar="SECONDS",
        help="how long a claim must stay below --idle-threshold to be reported idle",
    )
    env_flag(
        parser,
        "--device-metadata",
        type=boolean,
        default=True,
        metavar="true|false",
        help="give the containers of each claim prepared from now on its devices' attributes (UUID, "
        "PCI bus id, NUMA node, ...) in /var/run/kubernetes.io/dra-device-attributes (KEP-5304)",
    )
    env_flag(
        parser,
        "--device-metadata-dir",
        type=absolute_path,
        metavar="DIR",
        help="where the device metadata files are written: a host directory at the same path in this "
        "container (the claims' CDI specs mount them from there), best on a tmpfs, as they die with "
        "the boot (default <state-dir>/device-metadata; the DaemonSet puts them on the host's /run)",
    )
    env_switch(
        parser,
        "--require-admission-policy",
        help="exit at start when the API server lets this node's token write another node's "
        "ResourceSlices (the admission policy is missing); without it that is a loud warning",
    )
    env_flag(
        parser,
        "--health-config",
        type=absolute_path,
        metavar="FILE",
        help="YAML file overriding the GPU health policy (XID classes, quiet period, taint effect, "
        "thresholds); see docs/operations.md, 'GPU health'",
    )


def non_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return number


def probe_address(value: str) -> str:
    from dradriver.probes import parse_address

    try:
        parse_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _check_input_files(args: argparse.Namespace) -> None:
    """Files named on the command line are read before the sockets come up: bad input is one
    line and exit 2 with nothing created (built-in profiles need no check)."""
    if args.kubeconfig:  # as kubectl: a kubeconfig named explicitly must exist and parse
        from dradriver.files import FileInputError, load_document

        try:
            load_document(Path(args.kubeconfig).expanduser())
        except FileInputError as err:
            raise CLIError(f"--kubeconfig {err}") from None
    if args.fake_gpus:
        from dradriver.backend.fake.profiles import names as builtin_profile_names

        if args.fake_gpus in builtin_profile_names():
            return  # ours, and loading it costs the sockets-first start-up 0.1 s of imports
        from dradriver.backend.select import open_backend
        from dradriver.discovery import DiscoveryError

        try:
            open_backend(args.fake_gpus).close()
        except DiscoveryError as err:
            raise CLIError(f"--fake-gpus: {err}") from None


def run(args: argparse.Namespace) -> int:
    from dradriver.daemon import Daemon, ServeConfig

    mount = driver_root_mount(args)
    if not args.fake_gpus and not mount.is_dir():
        flag = "--driver-root-mount" if args.driver_root_mount else "--driver-root"
        raise CLIError(f"{flag} {mount}: no such directory in this container")
    _check_input_files(args)
    shares = share_policy(args)
    if (args.idle_threshold is None) != (args.idle_window is None):
        raise CLIError("--idle-threshold and --idle-window go together: give both, or neither")
    if args.idle_threshold is not None and not (args.metrics_address and args.telemetry_interval):
        raise CLIError(
            "--idle-threshold needs device telemetry: --metrics-address and a --telemetry-interval above 0"
        )

    health = None
    if args.health_config is not None:  # read before the sockets come up: a bad file is exit 2
        from dradriver.health.config import HealthConfigError, load_health_config

        try:
            health = load_health_config(args.health_config)
        except HealthConfigError as err:
            raise CLIError(f"--health-config {err}") from None

    config = ServeConfig(
        driver_name=args.driver_name,
        node_name=args.node_name,
        registry_dir=args.kubelet_registry_dir,
        plugins_dir=args.kubelet_plugins_dir,
        cdi_dir=args.cdi_dir,
        state_dir=state_dir(args),
        kubeconfig=args.kubeconfig,
        fake_gpus=args.fake_gpus,
        log_format=args.log_format,
        verbosity=args.verbosity,
        shutdown_grace=args.shutdown_grace,
        metrics_address=args.metrics_address,
        claims_dir=args.claims_dir,
        driver_root=args.driver_root,
        driver_root_mount=mount,
        partitionable=args.partitionable,
        stale_claim_grace=args.stale_claim_grace,
        health=health,
        proc_root=args.proc_root,
        node_lock_dir=args.node_lock_dir,
        metrics_tenant_labels=args.metrics_tenant_labels,
        host_dev=args.host_dev,
        pod_uid=args.pod_uid,
        rescan_interval=args.rescan_interval,
        telemetry_interval=args.telemetry_interval,
        idle_threshold=args.idle_threshold,
        idle_window=args.idle_window,
        shares=shares,
        require_admission_policy=args.require_admission_policy,
        device_metadata=args.device_metadata,
        device_metadata_dir=args.device_metadata_dir,
    )
    return Daemon(config).run()
