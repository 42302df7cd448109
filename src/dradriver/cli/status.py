"""`dradriver status`: which claims this node has prepared, and the health of its devices.

No cluster and no running plugin needed: it reads `<state-dir>/checkpoint.json` and the health
report `serve` keeps beside it (`health.json`, rewritten on every health change).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dradriver.cli._common import (
    CLIError,
    add_command,
    add_driver_name_flag,
    add_plugins_dir_flag,
    add_state_dir_flag,
    state_dir,
)
from dradriver.health import HEALTH_FILE


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "status",
        help="show the claims prepared on this node (from the checkpoint) and its devices' health",
        run=run,
    )
    add_driver_name_flag(parser)
    add_plugins_dir_flag(parser)
    add_state_dir_flag(parser)
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")


def run(args: argparse.Namespace) -> int:
    from dradriver.prepare.checkpoint import CheckpointError, CheckpointStore

    directory = state_dir(args)
    if not directory.is_dir():
        where = (
            "--state-dir" if args.state_dir else "the state directory (--kubelet-plugins-dir/--driver-name)"
        )
        raise CLIError(
            f"{where} {directory}: no such directory; has dradriver serve run on this node with these flags?"
        )
    store = CheckpointStore(directory)
    try:
        checkpoint = store.load()
    except CheckpointError as err:
        raise CLIError(f"{store.path}: {err}") from None
    except PermissionError as err:
        raise CLIError(f"{store.path}: {err.strerror} (the checkpoint is root-only)") from None
    claims = sorted(checkpoint.claims.values(), key=lambda c: (c.namespace, c.name)) if checkpoint else []
    report = _health_report(directory)
    health = {str(d["device"]): str(d.get("health", "UNKNOWN")).lower() for d in report.get("devices", [])}
    rows = [
        {
            "namespace": c.namespace,
            "name": c.name,
            "uid": c.uid,
            "state": c.state.value,
            "preparedAt": c.prepared_at.isoformat(),
            "recovered": c.recovered,
            "cdiFile": c.cdi_file,
            "devices": [
                {
                    "device": d.device,
                    "uuid": d.uuid,
                    "requests": list(d.request_names),
                    "adminAccess": d.admin_access,
                    "sharing": d.sharing,
                    "cdiDeviceIds": list(d.cdi_device_ids),
                    "health": health.get(d.device, "unknown"),
                }
                for d in c.devices
            ],
        }
        for c in claims
    ]
    if args.output == "json":
        document = {
            "stateDir": str(directory),
            "claims": rows,
            "healthSource": report.get("source"),
            "devices": report.get("devices", []),
        }
        json.dump(document, sys.stdout, indent=2)
        print()
        return 0
    _print_table(directory, rows, checkpoint is not None)
    _print_health(directory, report)
    return 0


def _health_report(directory: Path) -> dict[str, Any]:
    """The daemon's last health report; empty when it has written none (or it is unreadable)."""
    try:
        data = json.loads((directory / HEALTH_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        return {}
    data["devices"] = [d for d in data["devices"] if isinstance(d, dict) and "device" in d]
    return data


def _print_table(directory: Path, rows: list[dict[str, Any]], have_checkpoint: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not have_checkpoint:
        console.print(f"no checkpoint in {directory}: nothing has been prepared on this node")
        return
    if not rows:
        console.print(f"no prepared claims ({directory / 'checkpoint.json'})")
        return
    table = Table(title=f"Prepared claims ({len(rows)}) — {directory / 'checkpoint.json'} (CDI IDs: -o json)")
    for column in ("claim", "state", "device", "uuid", "requests", "sharing", "health"):
        table.add_column(
            column, overflow="fold", no_wrap=column in {"claim", "state", "device", "uuid", "sharing"}
        )
    for row in rows:
        claim = f"{row['namespace']}/{row['name']}" if row["name"] else f"(recovered) {row['uid']}"
        devices = row["devices"] or [{}]
        for i, d in enumerate(devices):
            table.add_row(
                claim if i == 0 else "",
                row["state"] if i == 0 else "",
                d.get("device", "(none of ours)"),
                d.get("uuid", ""),
                ",".join(d.get("requests", [])) or ("all" if d else ""),
                d.get("sharing", "") + (" admin" if d.get("adminAccess") else ""),
                d.get("health", ""),
            )
    console.print(table)


def _print_health(directory: Path, report: dict[str, Any]) -> None:
    """A line when every device is healthy, else a table of those that are not."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    devices = report.get("devices", [])
    if not devices:
        console.print(
            f"no device health report in {directory / HEALTH_FILE}: serve is not running here, or its "
            "health monitoring is off"
        )
        return
    others = [d for d in devices if d.get("health") != "HEALTHY"]
    source = report.get("source", "?")
    if not others:
        console.print(f"device health: all {len(devices)} devices healthy (source: {source})")
        return
    table = Table(
        title=f"Device health: {len(others)} of {len(devices)} devices not healthy (source: {source})"
    )
    for column in ("device", "health", "updated", "message"):
        table.add_column(column, overflow="fold", no_wrap=column != "message")
    for d in others:
        table.add_row(
            str(d["device"]),
            str(d.get("health", "")),
            str(d.get("lastUpdated", "")),
            str(d.get("message", "")),
        )
    console.print(table)
