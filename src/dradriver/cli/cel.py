"""`dradriver cel eval`: one CEL selector against every device of an inventory.

Exit 0 when the expression was evaluated (even if some devices gave runtime errors, which are
reported per device), 2 when it does not compile or the input is invalid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dradriver.cli import _common
from dradriver.cli._dra_inputs import add_inventory_flags, check_node, inventory_from_args, parse_each

JSON_SCHEMA_VERSION = 1


COMMAND = _common.Command(help="evaluate DRA CEL selectors locally, with the scheduler's semantics")
EVAL = _common.Command(
    help="evaluate an expression against every device: true, false or error",
    description=(
        "Evaluate a DRA CEL selector against every device, as the scheduler would.\n"
        "Exit status: 0 evaluated (runtime errors are reported per device), "
        "2 the expression does not compile or the input is invalid."
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(title="cel commands", metavar="COMMAND", parser_class=_common.Parser)
    evaluate = _common.add_command(commands, "eval", EVAL, evaluate_expression)
    _common.env_flag(evaluate, "-e", "--expression", required=True, metavar="EXPR", help="the CEL expression")
    _common.add_driver_name_flag(evaluate)
    _common.add_feature_gates_flag(evaluate)
    add_inventory_flags(evaluate)
    _common.add_output_flag(evaluate)


def run(args: argparse.Namespace) -> int:
    """`dradriver cel` without a subcommand."""
    _common.print_error(args.prog, "missing command: use 'dradriver cel eval -e EXPR ...'")
    return 2


def evaluate_expression(args: argparse.Namespace) -> int:
    from dradriver.offline.allocation import parse_slice
    from dradriver.offline.cel import (
        CELCompileError,
        CELRuntimeError,
        compile_selector,
        hints_for,
        to_cel_device,
    )

    driver = args.driver_name
    lists = _common.gates_of(args)["DRAListTypeAttributes"]
    hints = hints_for(args.expression, driver)
    try:
        selector = compile_selector(args.expression, list_type_attributes=lists)
    except CELCompileError as err:
        return _compile_failure(args, err.message, hints)
    documents = inventory_from_args(args).resource_slices()
    slices = parse_each(documents, parse_slice)
    check_node(slices, args.node)
    rows: list[dict[str, Any]] = []
    for slice_ in slices:
        if args.node and slice_.node_name and slice_.node_name != args.node:
            continue
        for device in slice_.devices:
            row: dict[str, Any] = {
                "driver": device.driver,
                "pool": device.pool,
                "node": slice_.node_name or None,
                "device": device.name,
                "result": None,
                "error": None,
            }
            try:
                cel_device = to_cel_device(device.body, device.driver, list_type_attributes=lists)
                row["result"] = selector.matches(cel_device, device.driver)
            except CELRuntimeError as err:
                row["error"] = err.message
            rows.append(row)
    summary = {
        "true": sum(1 for r in rows if r["result"] is True),
        "false": sum(1 for r in rows if r["result"] is False),
        "error": sum(1 for r in rows if r["error"] is not None),
    }
    show_hints = hints if (summary["error"] or not summary["true"]) else []
    if args.output != "table":
        from dradriver.cli._output import write_document

        write_document(
            {
                "schemaVersion": JSON_SCHEMA_VERSION,
                "expression": args.expression,
                "error": None,
                "devices": rows,
                "summary": summary,
                "hints": [{"message": h.message, "corrected": h.corrected} for h in show_hints],
            },
            args.output,
        )
    else:
        _print_table(args.expression, rows, summary, show_hints)
    return 0


def _compile_failure(args: argparse.Namespace, message: str, hints: list[Any]) -> int:
    if args.output != "table":
        from dradriver.cli._output import write_document

        write_document(
            {
                "schemaVersion": JSON_SCHEMA_VERSION,
                "expression": args.expression,
                "error": {"kind": "compile", "message": message},
                "devices": [],
                "summary": {"true": 0, "false": 0, "error": 0},
                "hints": [{"message": h.message, "corrected": h.corrected} for h in hints],
            },
            args.output,
        )
        return 2
    print(f"{args.prog}: error: the expression does not compile:", file=sys.stderr)
    print(message, file=sys.stderr)
    for hint in hints:
        print(f"hint: {hint.message}\n  try: {hint.corrected}", file=sys.stderr)
    return 2


def _print_table(
    expression: str, rows: list[dict[str, Any]], summary: dict[str, int], hints: list[Any]
) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from dradriver.cli._render import console

    out = console()
    out.print(Text(expression, style="bold"))
    table = Table(show_lines=False)
    table.add_column("DEVICE", overflow="fold")
    table.add_column("RESULT")
    table.add_column("DETAIL", overflow="fold")
    for row in rows:
        where = "/".join(p for p in (row["node"] or row["pool"], row["device"]) if p)
        if row["error"] is not None:
            table.add_row(escape(where), "[red]error[/red]", escape(row["error"]))
        else:
            table.add_row(escape(where), "[green]true[/green]" if row["result"] else "false", "")
    out.print(table)
    out.print(
        f"{summary['true']} true, {summary['false']} false, {summary['error']} error of {len(rows)} devices"
    )
    for hint in hints:
        out.print(f"[yellow]hint:[/yellow] {escape(hint.message)}\n  try: {escape(hint.corrected)}")
