"""`dradriver dry-run`: would the scheduler allocate these claims on a node, and why (not)?

Exit 0 when every claim can be allocated on some node (and, given ResourceQuotas, the API server
would admit them), 1 when not (including the errors the scheduler would stop with, such as a
CEL runtime error, and a quota refusing a claim), 2 for invalid input (unreadable files,
malformed objects, selectors that do not compile).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dradriver.cli import _common, _quota
from dradriver.cli._common import env_list_flag
from dradriver.cli._dra_inputs import (
    ClassDirectory,
    ClassSource,
    Cluster,
    Document,
    Files,
    add_inventory_flags,
    check_node,
    extended_resource_claims,
    inventory_from_args,
    parse_each,
    read_objects,
)

JSON_SCHEMA_VERSION = 1
DEFAULT_MAX_ROWS = 40
# kube-scheduler's default DRA filter timeout per node (DRASchedulerFilterTimeout, on in 1.36).
DEFAULT_TIMEOUT_SECONDS = 10.0


COMMAND = _common.Command(
    help="simulate the scheduler's device allocation for claims and explain the outcome",
    description=(
        "Simulate how the Kubernetes scheduler allocates devices for ResourceClaims (or templates):\n"
        "each selector's outcome per request and device, then the allocation or why there is none.\n"
        "Classes come from --class, the cluster (--cluster), else the built-in DeviceClasses\n"
        "(the repository's deviceclasses/ and deviceclasses/optional/, shipped with dradriver: see\n"
        "'dradriver examples').\n"
        "With --resource-quota (or --cluster), also whether the namespaces' ResourceQuotas admit\n"
        "the claims (and pods) the input creates, counted as the API server counts them.\n"
        "Exit status: 0 satisfiable, 1 unsatisfiable or refused by a quota, 2 invalid input."
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    env_list_flag(
        parser,
        "--claim",
        help="ResourceClaim or ResourceClaimTemplate files (required); DeviceClasses in them are used too",
    )
    env_list_flag(parser, "--class", dest="classes", help="DeviceClass files (default: the built-in classes)")
    _common.add_driver_name_flag(parser)
    _common.add_feature_gates_flag(parser)
    _common.env_flag(
        parser,
        "--timeout",
        type=_common.duration,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="give up on a node after this long, as the scheduler does after its filter timeout (0: never)",
    )
    add_inventory_flags(parser)
    _quota.add_quota_flags(parser, cluster=True)
    _common.add_output_flag(parser)
    _common.env_switch(
        parser,
        "--all-devices",
        help=f"list every device in the tables (default: at most {DEFAULT_MAX_ROWS} per request)",
    )


def _class_source(args: argparse.Namespace) -> ClassSource:
    if args.classes:
        return Files("--class", args.classes)
    if args.cluster:
        return Cluster(args.kubeconfig)
    from dradriver import data

    return ClassDirectory((data.DEVICE_CLASSES, data.OPTIONAL_DEVICE_CLASSES))


def _name_of(document: Document) -> str | None:
    """A document's metadata.name; None when it has none that is a string (parsing reports it)."""
    metadata = document.obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else None


def run(args: argparse.Namespace) -> int:
    from dradriver.offline.allocation import (
        parse_claim,
        parse_device_class,
        parse_slice,
        simulate,
    )

    if not args.claim:
        raise _common.CLIError("--claim FILE is required")
    workloads: list[Document] = []
    claim_docs = read_objects(
        args.claim, ["ResourceClaim", "ResourceClaimTemplate", "DeviceClass"], "--claim", others=workloads
    )
    # A DeviceClass beside the claims (a manifest that ships its own class) joins the others.
    own_classes = [d for d in claim_docs if d.obj.get("kind") == "DeviceClass"]
    claim_docs = [d for d in claim_docs if d.obj.get("kind") != "DeviceClass"]
    own_names = {_name_of(d) for d in own_classes}
    class_docs = [
        d for d in _class_source(args).device_classes() if _name_of(d) not in own_names
    ] + own_classes
    outcomes = _quota.check_quotas(
        args,
        claim_docs,
        workloads,
        class_docs,
        _common.cluster_client(args.kubeconfig) if args.cluster else None,
    )
    claim_docs += extended_resource_claims(workloads, class_docs)
    if not claim_docs:
        raise _common.CLIError(
            "--claim: no ResourceClaim, ResourceClaimTemplate or pod asking for a class's extended resource"
        )
    slice_docs = inventory_from_args(args).resource_slices()

    claims = parse_each(claim_docs, parse_claim)
    classes = {c.name: c for c in parse_each(class_docs, parse_device_class)}
    slices = parse_each(slice_docs, parse_slice)
    check_node(slices, args.node)
    lists = _common.gates_of(args)["DRAListTypeAttributes"]
    problems = _compile_problems(
        claim_docs, claims, class_docs, list(classes.values()), args.driver_name, lists
    )
    if problems:
        return _report_compile_problems(args, problems)
    simulation = simulate(
        claims,
        classes,
        slices,
        node=args.node,
        in_use=_in_use(args, claims),
        list_type_attributes=lists,
        timeout=args.timeout or None,
    )
    errors = any(d.error for n in simulation.nodes for c in n.claims for r in c.requests for d in r.devices)
    hints = _hints(claims, classes.values(), args.driver_name) if errors or not simulation.satisfiable else []
    if args.output != "table":
        from dradriver.cli._output import write_document

        report = to_json(simulation, hints)
        if outcomes is not None:
            report["quota"] = _quota.to_json(outcomes)
        write_document(report, args.output, compact=True)
    else:
        _print_tables(simulation, hints, max_rows=None if args.all_devices else DEFAULT_MAX_ROWS)
        if outcomes is not None:
            print("\nResourceQuota admission:")
            print("\n".join(f"  {line}" for line in _quota.lines(outcomes)) or "  nothing to admit")
    return 0 if simulation.satisfiable and _quota.admitted(outcomes) else 1


def _in_use(args: argparse.Namespace, claims: list[Any]) -> list[Any]:
    """With --cluster, the cluster's allocated claims (other than those being simulated): the
    scheduler counts their devices and shared counters as taken."""
    from dradriver.offline.allocation import InputError, parse_claim

    if not args.cluster:
        return []
    try:
        documents = Cluster(args.kubeconfig, args.node).allocated_claims()
    except _common.CLIError as err:
        print(
            f"dradriver dry-run: warning: {err}; devices already allocated in the cluster are not counted",
            file=sys.stderr,
        )
        return []
    simulated = {(c.namespace, c.name) for c in claims}
    taken = []
    for doc in documents:
        try:
            claim = parse_claim(doc.obj)
        except InputError as err:
            print(
                f"dradriver dry-run: warning: {doc.where}: {err}; its devices are not counted",
                file=sys.stderr,
            )
            continue
        if (claim.namespace, claim.name) not in simulated:
            taken.append(claim)
    return taken


# -- selectors that do not compile -----------------------------------------------------------------


def _selectors_of(claim: Any) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for request in claim.requests:
        subs = list(request.first_available) if request.first_available else [request.exactly]
        for sub in subs:
            name = f"{request.name}/{sub.name}" if request.first_available else request.name
            for i, expression in enumerate(sub.selectors):
                out.append((f"request {name} selector #{i}", expression))
    return out


def _compile_problems(  # noqa: PLR0917 - the documents and what was parsed from them, side by side
    claim_docs: list[Document],
    claims: list[Any],
    class_docs: list[Document],
    classes: list[Any],
    driver: str,
    list_type_attributes: bool,
) -> list[dict[str, Any]]:
    from dradriver.offline.cel import CELCompileError, compile_selector, hints_for

    problems = []
    items = [(doc, f"claim {c.ref}", _selectors_of(c)) for doc, c in zip(claim_docs, claims, strict=True)]
    items += [
        (doc, f"class {c.name}", [(f"selector #{i}", e) for i, e in enumerate(c.selectors)])
        for doc, c in zip(class_docs, classes, strict=True)
    ]
    for doc, owner, selectors in items:
        for what, expression in selectors:
            try:
                compile_selector(expression, list_type_attributes=list_type_attributes)
            except CELCompileError as err:
                problems.append(
                    {
                        "where": doc.where,
                        "object": owner,
                        "selector": what,
                        "expression": expression,
                        "message": err.message,
                        "hints": [
                            {"message": h.message, "corrected": h.corrected}
                            for h in hints_for(expression, driver)
                        ],
                    }
                )
    return problems


def _report_compile_problems(args: argparse.Namespace, problems: list[dict[str, Any]]) -> int:
    if args.output != "table":
        from dradriver.cli._output import write_document

        write_document(
            {
                "schemaVersion": JSON_SCHEMA_VERSION,
                "satisfiable": False,
                "node": None,
                "error": "selectors do not compile",
                "compileErrors": problems,
                "nodes": [],
                "hints": [h for p in problems for h in p["hints"]],
            },
            args.output,
        )
        return 2
    for problem in problems:
        first, *rest = problem["message"].splitlines()
        print(f"{problem['where']}: {problem['object']}, {problem['selector']}: {first}", file=sys.stderr)
        for line in rest:
            print(f"  {line}", file=sys.stderr)
        for hint in problem["hints"]:
            print(f"  hint: {hint['message']}\n    try: {hint['corrected']}", file=sys.stderr)
    return 2


def _hints(claims: list[Any], classes: Any, driver: str) -> list[dict[str, str]]:
    from dradriver.offline.cel import hints_for

    expressions = [e for c in claims for _, e in _selectors_of(c)] + [e for c in classes for e in c.selectors]
    out: list[dict[str, str]] = []
    for expression in expressions:
        for hint in hints_for(expression, driver):
            entry = {"expression": expression, "message": hint.message, "corrected": hint.corrected}
            if entry not in out:
                out.append(entry)
    return out


# -- JSON -----------------------------------------------------------------------------------------------


def to_json(simulation: Any, hints: list[dict[str, str]]) -> dict[str, Any]:
    """The documented `-o json` schema (schemaVersion 1); see docs/tools.md, "dry-run JSON output"."""
    chosen = simulation.chosen
    return {
        "schemaVersion": JSON_SCHEMA_VERSION,
        "satisfiable": simulation.satisfiable,
        "node": chosen.node if chosen else None,
        "error": None,
        "compileErrors": [],
        "nodes": [_node_json(n) for n in simulation.nodes],
        "hints": hints,
    }


def _node_json(node: Any) -> dict[str, Any]:
    return {
        "node": node.node,
        "satisfiable": node.satisfiable,
        "error": node.error,
        "reason": node.reason,
        "warnings": list(node.warnings),
        "claims": [_claim_json(c) for c in node.claims],
    }


def _claim_json(report: Any) -> dict[str, Any]:
    claim = report.claim
    return {
        "kind": claim.kind,
        "namespace": claim.namespace or None,
        "name": claim.name,
        "preallocated": report.preallocated,
        "allocation": [
            {
                "request": r.request,
                "driver": r.driver,
                "pool": r.pool,
                "device": r.device,
                "adminAccess": r.admin_access,
                "shareID": r.share_id,
                "consumedCapacity": dict(r.consumed_capacity) or None,
            }
            for r in report.results
        ],
        "reason": report.reason,
        "requests": [
            {
                "name": r.request,
                "deviceClassName": r.device_class,
                "allocationMode": r.mode,
                "count": r.count if r.mode != "All" else None,
                "adminAccess": r.admin_access,
                "selected": r.selected,
                "matchingDevices": r.matching,
                "devices": [
                    {
                        "device": d.device,
                        "matches": d.matches,
                        "error": d.error,
                        "selectors": [
                            {
                                "source": s.source,
                                "index": s.index,
                                "expression": s.expression,
                                "outcome": s.outcome,
                                "message": s.message or None,
                            }
                            for s in d.selectors
                        ],
                    }
                    for d in r.devices
                ],
            }
            for r in report.requests
        ],
    }


# -- tables ---------------------------------------------------------------------------------------------

_STYLE = {
    "true": "[green]true[/green]",
    "false": "false",
    "error": "[red]error[/red]",
    "skipped": "[dim]-[/dim]",
}


def _print_tables(simulation: Any, hints: list[dict[str, str]], *, max_rows: int | None) -> None:
    from rich.markup import escape

    from dradriver.cli._render import console

    out = console()
    for node in simulation.nodes:
        verdict = "[green]SATISFIABLE[/green]" if node.satisfiable else "[red]NOT SATISFIABLE[/red]"
        out.print(f"\n[bold]Node {escape(node.node or '(all nodes)')}[/bold]: {verdict}")
        for warning in node.warnings:
            out.print(f"[yellow]warning:[/yellow] {escape(warning)}")
        for claim in node.claims:
            _print_claim(out, claim, max_rows)
        for device, count, used in shares_by_device(node.claims):
            amounts = ", ".join(f"{name} {amount}" for name, amount in used.items())
            out.print(f"  shares of {escape(device)}: {count} ({escape(amounts)})")
        if node.error:
            out.print(f"[red]scheduler error:[/red] {escape(node.error)}")
        elif node.reason and not any(claim.reason for claim in node.claims):
            out.print(f"[red]reason:[/red] {escape(node.reason)}")
    chosen = simulation.chosen
    out.print(
        f"\nResult: satisfiable on node {escape(chosen.node or '(all nodes)')}"
        if chosen
        else "\nResult: [red]not satisfiable on any node[/red]"
    )
    for hint in hints:
        out.print(f"[yellow]hint:[/yellow] {escape(hint['message'])}\n  try: {escape(hint['corrected'])}")


def _print_claim(out: Any, report: Any, max_rows: int | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    claim = report.claim
    out.print(f"\n[bold]{claim.kind} {escape(claim.ref)}[/bold]")
    if report.preallocated:
        out.print("  already allocated; its devices are in use")
    for request in report.requests:
        mode = "all devices" if request.mode == "All" else f"{request.count} device(s)"
        chosen = "" if request.selected else " [dim](not used)[/dim]"
        out.print(
            f"  request [bold]{escape(request.request)}[/bold]{chosen}: {mode} of class "
            f"{escape(request.device_class)}{', adminAccess' if request.admin_access else ''}; "
            f"{request.matching} of {len(request.devices)} devices match"
        )
        if not request.devices:
            continue
        columns = [f"{s.source} #{s.index}" for s in request.devices[0].selectors]
        table = Table(show_header=True, header_style="bold", pad_edge=False)
        table.add_column("DEVICE", overflow="fold")
        for column in columns:
            table.add_column(escape(column))
        table.add_column("DETAIL", overflow="fold")
        shown = request.devices if max_rows is None else _rows_to_show(request.devices, max_rows)
        for device in shown:
            cells = [_STYLE.get(s.outcome, s.outcome) for s in device.selectors]
            table.add_row(escape(device.device), *cells, escape(device.error or ""))
        out.print(table)
        hidden = len(request.devices) - len(shown)
        if hidden:
            out.print(
                f"  … {hidden} more devices not shown ({_summary(request.devices, shown)}; "
                "--all-devices lists them)"
            )
    if report.results:
        out.print("  allocation:")
        for result in report.results:
            admin = " (adminAccess)" if result.admin_access else ""
            if result.consumed_capacity:
                used = ", ".join(f"{name} {amount}" for name, amount in result.consumed_capacity)
                admin += escape(f" (shared: {used})")
            out.print(
                f"    {escape(result.request)} → "
                f"{escape(f'{result.driver}/{result.pool}/{result.device}')}{admin}"
            )
    if report.reason:
        out.print(f"  [red]cannot allocate:[/red] {escape(report.reason)}")


def shares_by_device(claims: Any) -> list[tuple[str, int, dict[str, Any]]]:
    """Each shared device the claims are allocated: how many shares, and what they consume together."""
    from dradriver.offline.allocation.capacity import Amount, parse_amount

    found: dict[str, tuple[int, dict[str, Amount]]] = {}
    for claim in claims:
        for result in claim.results:
            if result.share_id is None:
                continue
            device = f"{result.driver}/{result.pool}/{result.device}"
            count, used = found.get(device, (0, {}))
            for name, text in result.consumed_capacity:
                amount = parse_amount(text, f"{device} {name}")
                before = used.get(name)
                used[name] = amount if before is None else Amount(before.value + amount.value, amount.binary)
            found[device] = (count + 1, used)
    return [(device, count, {k: str(v) for k, v in used.items()}) for device, (count, used) in found.items()]


def _rows_to_show(devices: list[Any], max_rows: int) -> list[Any]:
    """Matching and failing devices first (they explain the outcome), then the rest, in order."""
    interesting = [d for d in devices if d.matches or d.error]
    rest = [d for d in devices if not (d.matches or d.error)]
    keep = {id(d) for d in (interesting + rest)[:max_rows]}
    return [d for d in devices if id(d) in keep]


def _summary(devices: list[Any], shown: list[Any]) -> str:
    shown_ids = {id(d) for d in shown}
    counts: dict[str, int] = {}
    for device in devices:
        if id(device) in shown_ids:
            continue
        first_false = next((s for s in device.selectors if s.outcome in ("false", "error")), None)
        key = (
            "match"
            if device.matches
            else f"{first_false.source} #{first_false.index} {first_false.outcome}"
            if first_false
            else "no match"
        )
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
