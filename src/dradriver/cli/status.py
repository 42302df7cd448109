"""`dradriver status`: which claims this node has prepared, the MIG devices made for them, and
the health of its devices.

No cluster and no running plugin needed: it reads `<state-dir>/checkpoint.json` and the health
report `serve` keeps beside it (`health.json`, rewritten on every health change).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dradriver.cli._common import (
    CLIError,
    Command,
    add_driver_name_flag,
    add_output_flag,
    add_plugins_dir_flag,
    add_state_dir_flag,
    state_dir,
)
from dradriver.health import HEALTH_FILE
from dradriver.prepare.gpu_shares import describe_share, share_json

if TYPE_CHECKING:
    from dradriver.prepare.checkpoint import MigRecord

#: health.json lists one entry per device; a file far larger was not written by serve.
MAX_HEALTH_REPORT_BYTES = 4 * 1024 * 1024


COMMAND = Command(
    help="show the claims prepared on this node (from the checkpoint) and its devices' health",
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_driver_name_flag(parser)
    add_plugins_dir_flag(parser)
    add_state_dir_flag(parser)
    add_output_flag(parser)


def run(args: argparse.Namespace) -> int:
    from dradriver.prepare.cdi import spec_state
    from dradriver.prepare.checkpoint import FILE_NAME, CheckpointError
    from dradriver.prepare.ledger import read_checkpoint

    directory = state_dir(args)
    if not directory.is_dir():
        where = (
            "--state-dir" if args.state_dir else "the state directory (--kubelet-plugins-dir/--driver-name)"
        )
        raise CLIError(
            f"{where} {directory}: no such directory; has dradriver serve run on this node with these flags?"
        )
    try:
        checkpoint = read_checkpoint(directory)
    except CheckpointError as err:
        raise CLIError(f"{directory / FILE_NAME}: {err}") from None
    except PermissionError as err:
        raise CLIError(f"{directory / FILE_NAME}: {err.strerror} (the checkpoint is root-only)") from None
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
            # The runtime fails every container of a claim whose spec is gone or changed.
            **({"cdiSpec": spec_state(Path(c.cdi_file), c.cdi_spec)} if c.cdi_file else {}),
            "devices": [
                {
                    "device": d.device,
                    "uuid": d.uuid,
                    "requests": list(d.request_names),
                    "adminAccess": d.admin_access,
                    "sharing": d.sharing,
                    "cdiDeviceIds": list(d.cdi_device_ids),
                    "health": health.get(d.device, "unknown"),
                    **({"createdMig": _created_mig(d.mig)} if d.mig is not None else {}),
                    **({"shareID": d.share_id} if d.share_id is not None else {}),
                    **({"share": share_json(d.share)} if d.share is not None else {}),
                }
                for d in c.devices
            ],
        }
        for c in claims
    ]
    if args.output != "table":
        from dradriver.cli._output import write_document

        document = {
            "stateDir": str(directory),
            "claims": rows,
            "healthSource": report.get("source"),
            "devices": report.get("devices", []),
        }
        write_document(document, args.output)
        return 0
    from rich.console import Console

    console = Console(highlight=False)  # the terminal's width; 80 columns (or $COLUMNS) without one
    _print_table(console, directory, rows, checkpoint is not None)
    _print_created_migs(console, rows)
    _print_health(console, directory, report)
    return 0


def _created_mig(mig: MigRecord) -> dict[str, Any]:
    """Where dradriver made (or is making) a claim's MIG device; ids are null until made."""
    return {
        "gpuUUID": mig.parent_uuid,
        "profile": mig.profile,
        "placement": {"start": mig.placement_start, "size": mig.placement_size},
        "gpuInstance": mig.gi_id,
        "computeInstance": mig.ci_id,
    }


def _print_created_migs(console: Any, rows: list[dict[str, Any]]) -> None:
    """The MIG devices dradriver created for claims (--partitionable), each with its claim; the
    device name says the GPU, profile and placement."""
    from rich.table import Table

    created = [(row, d) for row in rows for d in row["devices"] if "createdMig" in d]
    if not created:
        return
    table = Table(title=f"MIG devices dradriver created ({len(created)})")
    for column in ("device", "GI/CI", "MIG UUID", "claim"):
        table.add_column(column, overflow="fold", no_wrap=column != "MIG UUID")
    for row, d in created:
        mig = d["createdMig"]
        ids = "/".join("-" if i is None else str(i) for i in (mig["gpuInstance"], mig["computeInstance"]))
        claim = f"{row['namespace']}/{row['name']}" if row["name"] else f"(recovered) {row['uid']}"
        table.add_row(d["device"], ids, d["uuid"] or "(not made yet)", claim)
    console.print(table)


def _health_report(directory: Path) -> dict[str, Any]:
    """The daemon's last health report; empty when it has written none (or it is unreadable)."""
    from dradriver.files import FileReadError, read_bytes

    try:
        data = json.loads(read_bytes(directory / HEALTH_FILE, MAX_HEALTH_REPORT_BYTES))
    except (FileReadError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        return {}
    data["devices"] = [d for d in data["devices"] if isinstance(d, dict) and "device" in d]
    return data


#: Short names of the checkpoint states, for the table.
_STATES = {"PrepareCompleted": "prepared", "PrepareStarted": "preparing"}
#: What the STATE column says instead when the claim's CDI spec is not as written.
_BROKEN_SPECS = {"missing": "spec missing", "differs": "spec changed"}


def _table() -> Any:
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)


def _print_table(console: Any, directory: Path, rows: list[dict[str, Any]], have_checkpoint: bool) -> None:
    """One row per prepared device, laid out to stay readable at 80 columns: only the claim name
    wraps; UUIDs and CDI device IDs are in -o json/yaml."""
    checkpoint = directory / "checkpoint.json"
    if not have_checkpoint:
        console.print(f"no checkpoint in {directory}: nothing has been prepared on this node", markup=False)
        return
    if not rows:
        console.print(f"no prepared claims ({checkpoint})", markup=False)
        return
    console.print(
        f"{len(rows)} prepared claim(s), from {checkpoint}; UUIDs and CDI IDs: -o yaml", markup=False
    )
    table = _table()
    table.add_column("CLAIM", overflow="fold", ratio=1, min_width=16)
    for column in ("STATE", "DEVICE", "HEALTH", "SHARING", "REQUESTS"):
        table.add_column(column, no_wrap=column != "REQUESTS", overflow="fold")
    broken = [row for row in rows if row.get("cdiSpec") in _BROKEN_SPECS]
    for row in rows:
        claim = f"{row['namespace']}/{row['name']}" if row["name"] else f"(recovered) {row['uid']}"
        state = _BROKEN_SPECS.get(row.get("cdiSpec", ""), _STATES.get(row["state"], row["state"]))
        for i, d in enumerate(row["devices"] or [{}]):
            sharing = (d.get("sharing") or "") + (" admin" if d.get("adminAccess") else "")
            if "share" in d:
                sharing = f"{sharing} {describe_share(d['share'], d['shareID'])}"
            table.add_row(
                claim if i == 0 else "",
                state if i == 0 else "",
                d.get("device", "(none of ours)"),
                d.get("health", ""),
                sharing.strip() or "-",
                ",".join(d.get("requests", [])) or ("all" if d else ""),
            )
    console.print(table)
    if broken:
        console.print(
            f"{len(broken)} claim(s) with a missing or changed CDI spec: their containers cannot start; "
            "the kubelet's next prepare of the claim, or a restart of serve, rewrites it",
            markup=False,
        )


def _print_health(console: Any, directory: Path, report: dict[str, Any]) -> None:
    """A line when every device is healthy, else a table of those that are not."""
    devices = report.get("devices", [])
    if not devices:
        console.print(
            f"no device health report in {directory / HEALTH_FILE}: serve is not running here, or its "
            "health monitoring is off",
            markup=False,
        )
        return
    others = [d for d in devices if d.get("health") != "HEALTHY"]
    source = report.get("source", "?")
    if not others:
        console.print(f"device health: all {len(devices)} devices healthy (source: {source})", markup=False)
        return
    console.print(f"device health: {len(others)} of {len(devices)} devices not healthy (source: {source})")
    table = _table()
    for column in ("DEVICE", "HEALTH", "SINCE", "MESSAGE"):
        table.add_column(
            column, overflow="fold", no_wrap=column != "MESSAGE", ratio=1 if column == "MESSAGE" else None
        )
    for d in others:
        table.add_row(
            str(d["device"]),
            str(d.get("health", "")),
            str(d.get("lastUpdated", "")),
            str(d.get("message", "")),
        )
    console.print(table)
