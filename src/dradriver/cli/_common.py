"""Building blocks shared by the subcommands: the parser class, env-backed flags, CLI errors.

Every flag `--some-flag` can also be set with the environment variable `DRADRIVER_SOME_FLAG`
(a DaemonSet sets flags through env more often than through args); an explicit flag wins.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from dradriver import DEFAULT_DRIVER_NAME
from dradriver.flagenv import env_name
from dradriver.names import dns_subdomain_error, driver_name_error, uid_error


class CLIError(Exception):
    """Bad input or a failed precondition: printed as one line, exit code 2, never a traceback."""

    exit_code = 2


class _FromEnv:
    """The default of a flag that can come from the environment, resolved after parsing.

    Resolving late means a bad DRADRIVER_* value is an error of the command that reads it (not
    of every command, e.g. `--version`), checked with the flag's own type and choices, and
    reported like a bad flag plus where it came from.
    """

    def __init__(self, names: Sequence[str], default: Any) -> None:
        self.names = tuple(names)
        self.default = default

    def __repr__(self) -> str:  # shown by --help as the default
        return repr(self.default)


def _clip(text: str) -> str:
    """Flag values are echoed in errors; a huge one (from the environment, say) is cut."""
    from dradriver.logs import clip_text

    return clip_text(text, 100)


#: What `str.splitlines` ends a line at, each written as its escape in a one-line error.
_LINE_BREAKS: dict[str | int, str | int | None] = {
    c: c.encode("unicode_escape").decode() for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
}


def one_line(text: str) -> str:
    """`text` with every character that would end a line (a value echoed from a flag or a
    variable may hold one) written as its escape."""
    return text.translate(str.maketrans(_LINE_BREAKS))


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit code 2, and whose flags'
    environment variables are checked exactly as the flags are."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(parsed, action.dest, None)
            if isinstance(value, _FromEnv):
                value = self._resolve(action, value)
                if value is None and getattr(action, "env_required", False):
                    names = " or ".join(f"${n}" for n in getattr(action, "env_names", ()))
                    flags = "/".join(action.option_strings)
                    self.error(f"the following arguments are required: {flags} (or {names})")
                setattr(parsed, action.dest, value)
            elif value is None and isinstance(getattr(action, "env", None), _FromEnv):
                setattr(parsed, action.dest, self._resolve(action, action.env))  # type: ignore[attr-defined]
        return parsed, extras

    def _resolve(self, action: argparse.Action, value: _FromEnv) -> Any:
        found = next(((n, os.environ[n]) for n in value.names if os.environ.get(n)), None)
        if found is None:
            return value.default
        name, raw = found
        where = f"argument {'/'.join(action.option_strings)} (from ${name})"  # as argparse names it
        if isinstance(action, argparse._StoreTrueAction):
            switch = raw.strip().lower()
            if switch not in _TRUE | _FALSE:
                self.error(f"{where}: invalid value {_clip(raw)!r}: use true or false")
            return switch in _TRUE
        if action.nargs in ("+", "*"):
            return raw.split()
        try:
            converted = action.type(raw) if callable(action.type) else raw
        except argparse.ArgumentTypeError as err:
            self.error(f"{where}: {err}")
        except (TypeError, ValueError):
            kind = getattr(action.type, "__name__", repr(action.type))
            self.error(f"{where}: invalid {kind} value: {_clip(raw)!r}")
        if action.choices is not None and converted not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            self.error(f"{where}: invalid choice: {_clip(raw)!r} (choose from {choices})")
        return converted


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def boolean(value: str) -> bool:
    """A flag's `true` or `false` (also 1/0, yes/no, on/off), as env switches read them."""
    word = value.strip().lower()
    if word not in _TRUE | _FALSE:
        raise argparse.ArgumentTypeError(f"invalid value {_clip(value)!r}: use true or false")
    return word in _TRUE


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
    shown = f"; default {default}" if default not in (None, "", False) else ""
    # A required flag is satisfied by its variable too, so argparse must not demand the flag.
    required = bool(kwargs.pop("required", False))
    action = parser.add_argument(
        *flags,
        type=type,
        default=_FromEnv(names, default),
        help=f"{help} (env {' or '.join(names)}{shown})",
        **kwargs,
    )
    action.env_required = required  # type: ignore[attr-defined]
    action.env_names = names  # type: ignore[attr-defined]


def env_switch(parser: argparse.ArgumentParser, flag: str, *, help: str) -> None:
    """A boolean flag; DRADRIVER_<FLAG>=true|1|yes|on turns it on, false|0|no|off leaves it off."""
    name = env_name(flag)
    parser.add_argument(
        flag, action="store_true", default=_FromEnv([name], False), help=f"{help} (env {name})"
    )


def env_list_flag(parser: Any, flag: str, *, help: str, dest: str | None = None) -> None:
    """A repeatable file flag (`--x A B --x C`); DRADRIVER_<FLAG> holds space-separated files."""
    name = env_name(flag)
    action = parser.add_argument(
        flag,
        dest=dest,
        nargs="+",
        action="extend",
        metavar="FILE",
        help=f"{help} (env {name}, space-separated)",
    )
    # `extend` appends to the default (None here); the environment is read once parsing is done.
    action.env = _FromEnv([name], None)


#: Upper bound of every duration flag, so that a unit mix-up (milliseconds) is caught.
MAX_DURATION_SECONDS = 7 * 24 * 3600


def bounded(kind: str, low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """argparse type for a finite number from `low` to `high` (a `kind`, in `unit`)."""

    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and low <= number <= high):
            raise argparse.ArgumentTypeError(
                f"invalid {kind} {_clip(value)!r}: must be a number{unit} from {low:g} to {high:g}"
            )
        return number

    return parse


#: argparse type for a percentage.
percent = bounded("percentage", 0, 100)
#: argparse type for seconds: finite, from 0 to a week (NaN, inf and -1 are errors).
duration = bounded("duration", 0, MAX_DURATION_SECONDS, " of seconds")


def positive_duration(value: str) -> float:
    seconds = duration(value)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {_clip(value)!r}: must be more than 0 seconds")
    return seconds


def verbosity(value: str) -> int:
    try:
        level = int(value)
    except ValueError:
        level = -1
    if not 0 <= level <= 10:
        raise argparse.ArgumentTypeError(
            f"invalid verbosity {_clip(value)!r}: must be an integer from 0 to 10"
        )
    return level


def existing_directory(value: str) -> Path:
    """argparse type for directories that must already exist (absolute, as the kubelet sees them)."""
    path = Path(value).absolute()
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{_clip(value)}: {problem}")
    return path


def checked_name(kind: str, error_of: Callable[[str], str | None]) -> Callable[[str], str]:
    """argparse type for a name that `error_of` checks (the rules in `dradriver.names`)."""

    def parse(value: str) -> str:
        if (err := error_of(value)) is not None:
            raise argparse.ArgumentTypeError(f"invalid {kind} {_clip(value)!r}: {err}")
        return value

    return parse


#: argparse type for --driver-name.
driver_name = checked_name("driver name", driver_name_error)
#: argparse type for --node-name: the API server checks node names as DNS subdomains.
node_name = checked_name("node name", dns_subdomain_error)
#: argparse type for --pod-uid (empty: none): it becomes part of socket and lock file names.
pod_uid = checked_name("pod UID", lambda value: uid_error(value) if value else None)


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
        type=verbosity,
        default=0,
        metavar="N",
        help="log verbosity: 4 adds debug events, 6 every gRPC request and response",
    )


#: `-o` means the same on every command that prints objects: a table for people (fits the
#: terminal, or 80 columns without one), or the whole result as one JSON or YAML document.
OUTPUT_FORMATS = ("table", "json", "yaml")


def add_output_flag(parser: argparse.ArgumentParser, default: str = "table") -> None:
    env_flag(
        parser,
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default=default,
        help="table (for people), or the whole result as one json or yaml document",
    )


#: The gates whose effect dradriver's offline tools reproduce, at their Kubernetes 1.36 defaults.
FEATURE_GATES = {"DRAExtendedResource": True, "DRAListTypeAttributes": False}


def feature_gates(text: str) -> dict[str, bool]:
    """`--feature-gates A=true,B=false`, as Kubernetes components parse it (known gates only)."""
    gates = dict(FEATURE_GATES)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if name not in FEATURE_GATES:
            known = ", ".join(sorted(FEATURE_GATES))
            raise argparse.ArgumentTypeError(f"unknown feature gate {name!r} (dradriver follows: {known})")
        if not sep or value.strip().lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"invalid value of {name}: {value!r}, want true or false")
        gates[name] = value.strip().lower() == "true"
    return gates


def add_feature_gates_flag(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--feature-gates",
        type=feature_gates,
        default=None,
        metavar="GATE=BOOL,...",
        help=(
            "Kubernetes feature gates of the cluster to follow: "
            + ", ".join(f"{name} (default {str(on).lower()})" for name, on in sorted(FEATURE_GATES.items()))
        ),
    )


def gates_of(args: argparse.Namespace) -> dict[str, bool]:
    gates: dict[str, bool] | None = args.feature_gates
    return gates if gates is not None else dict(FEATURE_GATES)


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


@dataclass(frozen=True)
class Command:
    """How a subcommand presents itself. Every command module declares one as `COMMAND`, beside
    `add_flags(parser)` and `run(args)`; `build_parser` adds them all through `add_command`.

    `defer_logging` leaves logging to the command itself (serve configures it only once its
    sockets are up, because importing structlog is slow).
    """

    help: str
    description: str | None = None
    log_format: str = "console"
    defer_logging: bool = False


def add_command(
    subparsers: Any, name: str, command: Command, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """Create a subcommand parser with the shared logging flags."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=command.help,
        description=command.description or command.help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_logging_flags(parser, command.log_format)
    parser.set_defaults(run=run, prog=parser.prog, defer_logging=command.defer_logging)
    return parser


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
        help="publish every free MIG placement of GPUs in MIG mode, consuming shared counters, and create "
        "the MIG device when a claim for one is prepared (Kubernetes >= 1.35, DRAPartitionableDevices)",
    )


def add_gpu_shares_flags(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--gpu-shares",
        metavar="mps|unenforced[:GPU,...]",
        help="publish full GPUs (and their MIG devices) as shareable: consumable memory and computePercent "
        "capacities, each share held to its amounts by MPS (mps; a node without MPS fails the claim) or "
        "not held at all (unenforced); after ':' the GPUs by minor or UUID (default: all)",
    )
    env_flag(
        parser,
        "--gpu-share-count",
        type=int,
        default=4,
        metavar="N",
        help="with --gpu-shares: a share gets 1/N of the memory and compute it does not ask for",
    )


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that decide the devices this node publishes: `serve` and `dradriver slices` take
    the same ones, so that slices prints what serve would publish."""
    add_fake_gpus_flag(parser)
    add_driver_root_flags(parser)
    add_partitionable_flag(parser)
    add_gpu_shares_flags(parser)


def share_policy(args: argparse.Namespace) -> Any:
    """The SharePolicy of --gpu-shares / --gpu-share-count (None: off); one line when invalid."""
    if not args.gpu_shares:
        return None
    from dradriver.devicemodel.shares import parse_policy

    try:
        return parse_policy(args.gpu_shares, args.gpu_share_count)
    except ValueError as err:
        raise CLIError(f"--gpu-shares {args.gpu_shares}: {err}") from None


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
