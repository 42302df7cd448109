"""`dradriver fake-event`: inject a GPU health event into a running `serve --fake-gpus`.

It appends one line to `<state-dir>/fake-events.jsonl`, which the daemon follows; the device is
checked against the daemon's own health report (`health.json`), so a typo or a daemon that is
not on fake GPUs is an error here rather than an event nobody reads.

    dradriver fake-event --state-dir D --device gpu-3 --xid 79    # a fatal XID
    dradriver fake-event --state-dir D --device gpu-3 --xid 13 --recovery-action gpu-reset
                                          # an XID, with NVML's recovery action for the GPU
    dradriver fake-event --state-dir D --device gpu-3 --recovery-action none   # the GPU was reset
    dradriver fake-event --state-dir D --device gpu-3 --lost      # the GPU falls off the bus
    dradriver fake-event --state-dir D --device gpu-3 --restore   # ... and answers again
    dradriver fake-event --state-dir D --device gpu-3 --utilization 80 --memory-used 20Gi \
        --power 350 --process 4242:10Gi:50                        # its telemetry from now on

`--utilization` (with `--memory-used`, `--power`, `--process PID[:MEMORY[:SM_PERCENT]]`, each
repeatable for several processes) sets what the device's telemetry reports until it is set again
(`<state-dir>/fake-telemetry.json`); a process's pod is found from its real cgroup.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dradriver.cli._common import (
    CLIError,
    Command,
    add_driver_name_flag,
    add_plugins_dir_flag,
    add_state_dir_flag,
    bounded,
    percent,
    state_dir,
)
from dradriver.health import HEALTH_FILE
from dradriver.health.recovery import RecoveryAction

COMMAND = Command(
    help="inject a GPU health event (XID, GPU lost / restored) into a running serve --fake-gpus",
    description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_driver_name_flag(parser)
    add_plugins_dir_flag(parser)
    add_state_dir_flag(parser)
    parser.add_argument("--device", required=True, help="the published device name, e.g. gpu-3")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--xid", type=_xid, metavar="CODE", help="raise this XID on the device")
    kind.add_argument("--lost", action="store_true", help="mark the device's GPU lost (fallen off the bus)")
    kind.add_argument("--restore", action="store_true", help="make the device's GPU answer again")
    kind.add_argument(
        "--utilization", type=percent, metavar="PERCENT", help="the device's SM utilisation from now on"
    )
    parser.add_argument(
        "--recovery-action",
        choices=[a.flag_name for a in RecoveryAction],
        help="NVML's recovery action for the device's GPU from now on (with --xid: reported with it)",
    )
    parser.add_argument(
        "--memory-used", type=_quantity, metavar="BYTES", help="with --utilization: memory in use"
    )
    parser.add_argument(
        "--power",
        type=bounded("power", 0, 100_000, " of watts"),
        metavar="WATTS",
        help="with --utilization: power draw",
    )
    parser.add_argument(
        "--process",
        action="append",
        type=_process,
        default=[],
        metavar="PID[:MEMORY[:SM_PERCENT]]",
        help="with --utilization: a process using the device (repeatable)",
    )


def _xid(value: str) -> int:
    from dradriver.health.xid import MAX_XID

    try:
        code = int(value)
    except ValueError:
        code = -1
    if not 0 <= code <= MAX_XID:
        raise argparse.ArgumentTypeError(
            f"invalid XID {value[:40]!r}: must be an integer from 0 to {MAX_XID}"
        )
    return code


def _quantity(value: str) -> int:
    from dradriver.quantity import parse_quantity

    number = parse_quantity(value)
    if number is None or number < 0 or number != int(number):
        raise argparse.ArgumentTypeError(f"invalid memory {value[:40]!r}: a whole number of bytes, from 0")
    return int(number)


def _process(value: str) -> tuple[int, int | None, float | None]:
    parts = value.split(":")
    if len(parts) > 3 or not parts[0].isdigit() or int(parts[0]) == 0:
        raise argparse.ArgumentTypeError(f"invalid process {value[:40]!r}: PID[:MEMORY[:SM_PERCENT]]")
    memory = _quantity(parts[1]) if len(parts) > 1 and parts[1] else None
    sm = percent(parts[2]) if len(parts) > 2 else None
    return int(parts[0]), memory, sm


def run(args: argparse.Namespace) -> int:
    from dradriver.backend.fake.health import FakeEventRecord, append_fake_event
    from dradriver.health.xid import describe

    directory = state_dir(args)
    report_path = directory / HEALTH_FILE
    try:
        report = json.loads(report_path.read_text())
    except FileNotFoundError:
        raise CLIError(
            f"{report_path} not found: start 'dradriver serve --fake-gpus PROFILE' with this state "
            "directory first"
        ) from None
    except (OSError, ValueError) as err:
        raise CLIError(f"{report_path}: cannot read the daemon's health report: {err}") from None
    if report.get("source") != "fake":
        raise CLIError(
            f"the daemon using {directory} watches {report.get('source')!r} GPUs, not fake ones: "
            "it would not read the event"
        )
    known = [str(d.get("device")) for d in report.get("devices", [])]
    if args.device not in known:
        shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
        raise CLIError(f"--device: no device {args.device!r} on this node (it has {shown})")
    if args.utilization is None and (args.memory_used is not None or args.power is not None or args.process):
        raise CLIError("--memory-used, --power and --process go with --utilization")
    if args.recovery_action is not None and (args.lost or args.restore or args.utilization is not None):
        raise CLIError("--recovery-action goes with --xid or alone")
    kinds = (args.xid is not None, args.lost, args.restore, args.utilization is not None)
    if args.recovery_action is None and not any(kinds):
        raise CLIError("one of --xid, --lost, --restore, --recovery-action and --utilization is required")
    if args.utilization is not None:
        return _set_telemetry(directory, args)
    lost = True if args.lost else False if args.restore else None
    action = args.recovery_action
    record = FakeEventRecord(device=args.device, xid=args.xid, recovery=action, lost=lost, at=time.time())
    path = append_fake_event(directory, record)
    if args.xid is not None:
        what = describe(args.xid)
    else:
        what = f"recovery action {action}" if action else "GPU lost" if args.lost else "GPU restored"
    with_action = f" with recovery action {action}" if action and args.xid is not None else ""
    print(f"{what} on {args.device}{with_action}: appended to {path}")
    return 0


def _set_telemetry(directory: Path, args: argparse.Namespace) -> int:
    from dradriver.backend.fake.telemetry import (
        FAKE_TELEMETRY_FILE,
        FakeFigures,
        FakeProcess,
        read_figures,
        write_figures,
    )

    path = directory / FAKE_TELEMETRY_FILE
    try:
        figures = read_figures(path)
    except (OSError, ValueError) as err:
        raise CLIError(f"{path}: cannot read: {err}") from None
    figures[args.device] = FakeFigures(
        sm_util=args.utilization,
        fb_used_bytes=args.memory_used,
        power_watts=args.power,
        processes=tuple(FakeProcess(pid=pid, used_bytes=used, sm_util=sm) for pid, used, sm in args.process),
    )
    write_figures(path, figures)
    print(f"telemetry of {args.device} set: {args.utilization:g}% SM utilisation: written to {path}")
    return 0
