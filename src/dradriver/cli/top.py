"""`dradriver top`: this node's GPUs and MIG devices, who holds each, and how much they are used.

It reads the `/metrics` of the node's running `serve` (its --metrics-address, from
DRADRIVER_METRICS_ADDRESS as in the plugin pod, else 127.0.0.1:8080): run it in the plugin pod
(`kubectl -n dradriver exec ds/dradriver-kubelet-plugin -- dradriver top`) or on the node.

    dradriver top                 # one table, 80 columns, no TTY needed
    dradriver top --watch 2       # again every 2 seconds
    dradriver top -o json         # the same as one JSON document
    dradriver top --by namespace  # per namespace: claims, GPUs held, GPU-hours allocated and busy
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

from dradriver.cli._common import CLIError, Command, add_output_flag, env_flag
from dradriver.cli._output import write_document

DEFAULT_ADDRESS = "127.0.0.1:8080"
WIDTH = 80
_GIB = 1024**3


class NoServeError(CLIError):
    """Nothing answers at the address: not bad input, so exit 1."""

    exit_code = 1


COMMAND = Command(
    help="show this node's GPUs, who holds each (claim, pods), utilisation, memory and power",
    description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    env_flag(
        parser,
        "--metrics-address",
        type=_address,
        default=DEFAULT_ADDRESS,
        metavar="[HOST]:PORT",
        help="where the node's serve serves /metrics",
    )
    parser.add_argument(
        "--by",
        choices=("device", "namespace"),
        default="device",
        help="a line per device and holder (device), or per claim namespace (namespace): the "
        "prepared claims' GPUs now and their device-hours so far",
    )
    parser.add_argument(
        "--watch", type=_seconds, nargs="?", const=2.0, metavar="SECONDS", help="refresh every SECONDS (2)"
    )
    add_output_flag(parser)


def _address(value: str) -> str:
    from dradriver.probes import parse_address

    try:
        host, port = parse_address(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    host = host or "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0.1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"invalid interval {value[:40]!r}: seconds, from 0.1 to 3600")
    return seconds


@dataclass
class PodRow:
    pod: str
    sm_utilization: float | None = None
    memory_used_bytes: float | None = None


@dataclass
class DeviceRow:
    device: str
    uuid: str
    gpu_uuid: str
    claim: str = ""
    pods: list[str] = field(default_factory=list)
    sharing: str = ""
    sm_utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    pod_shares: list[PodRow] = field(default_factory=list)


_FIELDS = {
    "dradriver_gpu_sm_utilization_ratio": "sm_utilization",
    "dradriver_gpu_framebuffer_used_bytes": "memory_used_bytes",
    "dradriver_gpu_framebuffer_total_bytes": "memory_total_bytes",
    "dradriver_gpu_power_watts": "power_watts",
    "dradriver_gpu_temperature_celsius": "temperature_celsius",
}


def rows_from_metrics(text: str) -> list[DeviceRow]:
    """One row per device and holder, from serve's /metrics (pure)."""
    from prometheus_client.parser import text_string_to_metric_families

    rows: dict[tuple[str, str], DeviceRow] = {}
    pods: list[tuple[dict[str, str], str, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in _FIELDS:
                claim = (
                    f"{labels['claim_namespace']}/{labels['claim_name']}" if labels.get("claim_name") else ""
                )
                row = rows.setdefault(
                    (labels["device"], labels.get("claim_uid", "")),
                    DeviceRow(
                        labels["device"],
                        labels["uuid"],
                        labels["gpu_uuid"],
                        claim,
                        [p for p in labels.get("pods", "").split(",") if p],
                        labels.get("sharing", ""),
                    ),
                )
                setattr(row, _FIELDS[sample.name], sample.value)
            elif sample.name == "dradriver_pod_gpu_sm_utilization_ratio":
                pods.append((labels, "sm_utilization", sample.value))
            elif sample.name == "dradriver_pod_gpu_framebuffer_used_bytes":
                pods.append((labels, "memory_used_bytes", sample.value))
    for labels, attribute, value in pods:
        held = rows.get((labels["device"], labels["claim_uid"]))
        if held is None:
            continue
        name = f"{labels['namespace']}/{labels['pod']}"
        share = next((p for p in held.pod_shares if p.pod == name), None)
        if share is None:
            share = PodRow(name)
            held.pod_shares.append(share)
        setattr(share, attribute, value)
    return sorted(rows.values(), key=lambda r: (_natural(r.device), r.claim))


@dataclass
class NamespaceRow:
    namespace: str
    claims: int = 0
    #: Devices held now, a share counted as its fraction.
    devices: float = 0.0
    allocated_device_hours: float = 0.0
    busy_device_hours: float = 0.0

    @property
    def efficiency(self) -> float | None:
        return self.busy_device_hours / self.allocated_device_hours if self.allocated_device_hours else None


_COSTS = {
    "dradriver_gpu_allocated_devices": "devices",
    "dradriver_gpu_allocated_device_seconds_total": "allocated_device_hours",
    "dradriver_gpu_busy_device_seconds_total": "busy_device_hours",
}


def namespaces_from_metrics(text: str) -> list[NamespaceRow]:
    """One row per namespace of the prepared claims, from serve's cost series (pure)."""
    from prometheus_client.parser import text_string_to_metric_families

    rows: dict[str, NamespaceRow] = {}
    claims: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            attribute = _COSTS.get(sample.name)
            if attribute is None:
                continue
            namespace = sample.labels["claim_namespace"]
            row = rows.setdefault(namespace, NamespaceRow(namespace))
            claims.setdefault(namespace, set()).add(sample.labels["claim_uid"])
            scale = 1.0 if attribute == "devices" else 1 / 3600
            setattr(row, attribute, getattr(row, attribute) + sample.value * scale)
    for namespace, row in rows.items():
        row.claims = len(claims[namespace])
    return sorted(rows.values(), key=lambda r: r.namespace)


def render_namespaces(rows: list[NamespaceRow], width: int = WIDTH) -> str:
    """The per-namespace table, each line at most `width` characters (pure)."""
    if not rows:
        return "no claims prepared on this node\n"
    head = f"{'CLAIMS':>6} {'GPUS':>6} {'GPU-H ALLOC':>11} {'GPU-H BUSY':>10} {'EFF':>4}  NAMESPACE"
    lines = [head]
    for row in rows:
        lines.append(
            f"{row.claims:>6} {row.devices:>6.2f} {row.allocated_device_hours:>11.3f} "
            f"{row.busy_device_hours:>10.3f} {_percent(row.efficiency):>4}  {row.namespace}"
        )
    return "\n".join(_fit(line, width) for line in lines) + "\n"


def _natural(name: str) -> list[Any]:
    """gpu-2 before gpu-10, a GPU's MIG devices after it."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def _memory(used: float | None, total: float | None) -> str:
    if used is None:
        return "-"
    return f"{used / _GIB:.1f}/{total / _GIB:.0f}G" if total else f"{used / _GIB:.1f}G"


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render(rows: list[DeviceRow], width: int = WIDTH) -> str:
    """The table, each line at most `width` characters: a line per device and holder, then a
    line per pod the holder's claim is reserved for (pure)."""
    if not rows:
        return "no devices published (yet)\n"
    name = min(max(len("DEVICE"), *(len(r.device) for r in rows)), 20)
    head = f"{'DEVICE':<{name}} {'SM':>4} {'MEMORY':>11} {'POWER':>6} {'TEMP':>4}  HELD BY"
    lines = [head]
    left = max(width - len(head) + len("HELD BY"), 10)
    for row in rows:
        holder = (row.claim or "-") + (f" [{row.sharing}]" if row.sharing else "")
        power = "-" if row.power_watts is None else f"{row.power_watts:.0f}W"
        temperature = "-" if row.temperature_celsius is None else f"{row.temperature_celsius:.0f}C"
        lines.append(
            f"{_fit(row.device, name):<{name}} {_percent(row.sm_utilization):>4} "
            f"{_memory(row.memory_used_bytes, row.memory_total_bytes):>11} {power:>6} {temperature:>4}  "
            + _fit(holder, left)
        )
        # One line per pod the claim is reserved for, with what its processes use where known.
        shares = {share.pod: share for share in row.pod_shares}
        for pod in row.pods:
            share = shares.get(pod, PodRow(pod))
            lines.append(
                f"{'':<{name}} {_percent(share.sm_utilization):>4} "
                f"{_memory(share.memory_used_bytes, None):>11} {'':>6} {'':>4}  " + _fit(f"└ pod {pod}", left)
            )
    return "\n".join(line[:width] for line in lines) + "\n"


def fetch(address: str, timeout: float = 5.0) -> str:
    url = f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise NoServeError(
            f"no dradriver serve answers at {url} ({reason}): run this on the node or in the plugin pod, "
            "or pass --metrics-address (serve's own)"
        ) from None


def _show(args: argparse.Namespace) -> None:
    text = fetch(args.metrics_address)
    if args.by == "namespace":
        namespaces = namespaces_from_metrics(text)
        if args.output == "table":
            sys.stdout.write(render_namespaces(namespaces))
        else:
            documents = [{**asdict(r), "efficiency": r.efficiency} for r in namespaces]
            write_document({"namespaces": documents}, args.output)
    else:
        rows = rows_from_metrics(text)
        if args.output == "table":
            sys.stdout.write(render(rows))
        else:
            write_document({"devices": [asdict(r) for r in rows]}, args.output)
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    if args.watch is None:
        _show(args)
        return 0
    clear = sys.stdout.isatty() and args.output == "table"
    while True:
        if clear:
            sys.stdout.write("\033[H\033[2J")
        _show(args)
        if not clear:
            sys.stdout.write("\n")
        time.sleep(args.watch)
