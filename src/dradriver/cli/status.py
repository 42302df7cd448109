"""`dradriver status`: which claims this node has prepared, read from the checkpoint.

No cluster and no running plugin needed: it reads `<state-dir>/checkpoint.json` (and the health
snapshot the daemon keeps beside it, when there is one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dradriver.cli._common import (
    CLIError,
    absolute_path,
    add_command,
    add_driver_name_flag,
    add_plugins_dir_flag,
    env_flag,
)


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers, "status", help="show the claims prepared on this node (from the checkpoint)", run=run
    )
    add_driver_name_flag(parser)
    add_plugins_dir_flag(parser)
    env_flag(
        parser,
        "--state-dir",
        type=absolute_path,
        help="the plugin's state directory (default <kubelet-plugins-dir>/<driver-name>)",
    )
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")


def run(args: argparse.Namespace) -> int:
    from dradriver.prepare.checkpoint import CheckpointError, CheckpointStore

    state_dir: Path = args.state_dir or args.kubelet_plugins_dir / args.driver_name
    store = CheckpointStore(state_dir)
    try:
        checkpoint = store.load()
    except CheckpointError as err:
        raise CLIError(f"{store.path}: {err}") from None
    except PermissionError as err:
        raise CLIError(f"{store.path}: {err.strerror} (the checkpoint is root-only)") from None
    claims = sorted(checkpoint.claims.values(), key=lambda c: (c.namespace, c.name)) if checkpoint else []
    health = _health(state_dir)
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
        json.dump({"stateDir": str(state_dir), "claims": rows}, sys.stdout, indent=2)
        print()
        return 0
    _print_table(state_dir, rows, checkpoint is not None)
    return 0


def _health(state_dir: Path) -> dict[str, str]:
    """Device -> health from the daemon's last snapshot; empty when it has written none."""
    try:
        data = json.loads((state_dir / "health.json").read_text())
    except (OSError, ValueError):
        return {}
    return {str(d["device"]): str(d["health"]).lower() for d in data.get("devices", []) if "device" in d}


def _print_table(state_dir: Path, rows: list[dict[str, Any]], have_checkpoint: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not have_checkpoint:
        console.print(f"no checkpoint in {state_dir}: nothing has been prepared on this node")
        return
    if not rows:
        console.print(f"no prepared claims ({state_dir / 'checkpoint.json'})")
        return
    table = Table(title=f"Prepared claims ({len(rows)}) — {state_dir / 'checkpoint.json'} (CDI IDs: -o json)")
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
