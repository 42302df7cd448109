"""`dradriver migrate`: manifests for NVIDIA's DRA driver or its device plugin, and Helm values of
NVIDIA's DRA driver chart, rewritten for dradriver.

A document without apiVersion and kind that holds values of NVIDIA's chart (nvidiaDriverRoot,
kubeletPlugin, ...) becomes values of dradriver's chart (`dradriver.offline.migrate.helm`).

Reads files, directories (every *.yaml, *.yml, *.json below them) or stdin (`-`); writes the
migrated manifests as YAML with a comment per object saying what changed and why (`-o json`: a
report), to stdout or, with --output-dir, one file per input file. The translation itself is
`dradriver.offline.migrate` (pure); this module only reads, prints and writes.

A file in which anything has no dradriver equivalent is not written at all (a half-migrated
file would leave pods waiting for claims that never come); its problems are printed one per line
as FILE:DOC: OBJECT: FIELD: MESSAGE and the exit status is 2. Exit 0: everything migrated.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver.cli import _common

JSON_SCHEMA_VERSION = 1
SUFFIXES = (".yaml", ".yml", ".json")


COMMAND = _common.Command(
    help="rewrite manifests and Helm values for NVIDIA's DRA driver or device plugin for dradriver",
    description=(
        "Rewrite DeviceClasses, ResourceClaims, ResourceClaimTemplates and workloads written for\n"
        "NVIDIA's GPU DRA driver, or for the NVIDIA device plugin (nvidia.com/gpu and\n"
        "nvidia.com/mig-<profile> limits, GPU Feature Discovery node selectors, ResourceQuotas of\n"
        "requests.nvidia.com/gpu and requests.nvidia.com/mig-<profile>), for dradriver; and a\n"
        "values file of NVIDIA's DRA driver Helm chart as values of dradriver's chart.\n"
        "Every change is explained in a comment (-o json: a report). Whatever has no equivalent\n"
        "is printed as FILE:DOC: OBJECT: FIELD: MESSAGE, and its file is not written.\n"
        "Exit status: 0 migrated, 2 problems or unreadable input."
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", metavar="FILE|DIR|-", help="manifests; a directory is read recursively"
    )
    _common.add_driver_name_flag(parser)
    _common.env_flag(parser, "-o", "--output", choices=["yaml", "json"], default="yaml", help="output format")
    _common.env_flag(
        parser,
        "-O",
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="write one migrated file per input file there (same relative paths) instead of to stdout",
    )


@dataclass(frozen=True)
class _Input:
    """One input file: where it came from, its name relative to what was given, its documents."""

    source: str
    relative: Path
    documents: list[Any]


def _files(paths: list[str]) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for given in paths:
        path = Path(given)
        if given == "-":
            found.append(("-", Path("stdin.yaml")))
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
            if not files:
                raise _common.CLIError(f"{given}: no *.yaml, *.yml or *.json files in the directory")
            found += [(str(p), p.relative_to(path)) for p in files]
        elif path.exists():
            found.append((given, Path(path.name)))
        else:
            raise _common.CLIError(f"{given}: no such file or directory")
    relatives = [relative for _, relative in found]
    duplicate = next((r for r in relatives if relatives.count(r) > 1), None)
    if duplicate is not None:
        raise _common.CLIError(f"two inputs would be written as {duplicate}: give them in separate runs")
    return found


def _read(paths: list[str]) -> list[_Input]:
    from dradriver.cli._dra_inputs import parse_documents, read_documents

    inputs = []
    for source, relative in _files(paths):
        documents = parse_documents(sys.stdin.read(), "-") if source == "-" else read_documents(source)
        inputs.append(_Input(source, relative, documents))
    return inputs


def _shipped_classes() -> list[Any]:
    """dradriver's DeviceClasses, which migrated ResourceQuotas name."""
    from dradriver import data
    from dradriver.cli._dra_inputs import ClassDirectory

    directories = ClassDirectory((data.DEVICE_CLASSES, data.OPTIONAL_DEVICE_CLASSES))
    return [doc.obj for doc in directories.device_classes()]


def _describe(obj: Any) -> str:
    from dradriver.offline.migrate import describe
    from dradriver.offline.migrate.helm import VALUES, is_nvidia_values

    return VALUES if is_nvidia_values(obj) else describe(obj)


def _migrate(documents: list[Any], driver: str, shipped: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """(documents translated, their migrations, documents that are neither objects nor values)."""
    from dradriver.offline.migrate import migrate
    from dradriver.offline.migrate.helm import is_nvidia_values, migrate_values

    objects = [doc for doc in documents if doc.obj.get("apiVersion") and doc.obj.get("kind")]
    values = [doc for doc in documents if is_nvidia_values(doc.obj)]
    # Objects are translated per file: a file is the unit an operator applies together.
    done = dict(
        zip(
            [d.index for d in objects],
            migrate([d.obj for d in objects], driver=driver, shipped=shipped),
            strict=True,
        )
    )
    done.update((doc.index, migrate_values(doc.obj, driver=driver)) for doc in values)
    translated = [doc for doc in documents if doc.index in done]
    return (
        translated,
        [done[doc.index] for doc in translated],
        [doc for doc in documents if doc.index not in done],
    )


def run(args: argparse.Namespace) -> int:
    inputs = _read(args.paths)
    shipped = _shipped_classes()
    results = [(item, *_migrate(item.documents, args.driver_name, shipped)) for item in inputs]
    problems = 0
    for _item, documents, migrations, not_objects in results:
        for doc in not_objects:
            print(f"{doc.where}: not a Kubernetes object (no apiVersion or kind)", file=sys.stderr)
            problems += 1
        for doc, migration in zip(documents, migrations, strict=True):
            for problem in migration.problems:
                print(
                    f"{doc.where}: {_describe(doc.obj)}: {problem.path}: {problem.message}", file=sys.stderr
                )
                problems += 1
    if args.output == "json":
        _print_json(results, args.driver_name)
    elif args.output_dir is not None:
        _write_files(results, args.output_dir, inputs)
    else:
        for item, documents, migrations, not_objects in results:
            sys.stdout.write(
                _render_file(item, documents, migrations, failed=_failed(migrations, not_objects))
            )
    _summary(results)
    return 2 if problems else 0


def _failed(migrations: list[Any], not_objects: list[Any]) -> bool:
    return bool(not_objects) or any(m.problems for m in migrations)


def _short(value: Any) -> str | None:
    """A value fit for a one-line comment, or None when it is too long to be helpful there."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        text = ", ".join(value)
    elif isinstance(value, (str, int)):
        text = str(value)
    else:
        return None
    return text if "\n" not in text and len(text) <= 60 else None


def _comment(change: Any) -> str:
    if change.path.endswith(".cel.expression"):
        return f"#   {change.path}: rewritten ({change.reason})"
    before, after = _short(change.before), _short(change.after)
    if change.target:
        edit = f"{before if before is not None else 'set'} -> {change.target}" + (
            f": {after}" if after is not None else ""
        )
    elif change.after is None:
        edit = f"{before} removed" if before is not None else "removed"
    elif change.before is None and after is not None:
        edit = f"{after} added"
    elif before is not None and after is not None:
        edit = f"{before} -> {after}"
    else:
        edit = "rewritten"
    return f"#   {change.path}: {edit}" + (f" ({change.reason})" if change.reason else "")


def _render_file(item: _Input, documents: list[Any], migrations: list[Any], *, failed: bool) -> str:
    from dradriver.cli._output import dump_manifest

    if failed:
        return f"# dradriver migrate: {item.source}: not migrated: it has problems (listed on stderr)\n"
    parts = []
    for doc, migration in zip(documents, migrations, strict=True):
        outcome = migration.outcome if not migration.replaced_by else f"replaced by {migration.replaced_by}"
        lines = [f"# dradriver migrate: {doc.where}: {_describe(doc.obj)}: {outcome}"]
        lines += [_comment(c) for c in migration.changes]
        if not migration.outputs:
            parts.append("\n".join(lines) + "\n")
            continue
        for i, obj in enumerate(migration.outputs):
            header = "\n".join(lines) + "\n" if i == 0 else ""
            parts.append("---\n" + header + dump_manifest(obj))
    return "".join(parts)


def _write_files(results: list[Any], directory: Path, inputs: list[_Input]) -> None:
    given = {Path(i.source).resolve() for i in inputs if i.source != "-"}
    for item, documents, migrations, not_objects in results:
        if _failed(migrations, not_objects):
            continue
        target = directory / item.relative
        if target.resolve() in given:
            raise _common.CLIError(f"{target}: would overwrite an input file; choose another --output-dir")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_render_file(item, documents, migrations, failed=False))


def _print_json(results: list[Any], driver: str) -> None:
    from dradriver.cli._output import dump_json

    files = []
    for item, documents, migrations, not_objects in results:
        objects = []
        for doc in not_objects:
            problem = {"path": "", "message": "not a Kubernetes object (no apiVersion or kind)"}
            objects.append(
                {"document": doc.index, "object": None, "outcome": "failed", "replacedBy": None,
                 "changes": [], "problems": [problem], "outputs": []}
            )  # fmt: skip
        for doc, migration in zip(documents, migrations, strict=True):
            objects.append(
                {
                    "document": doc.index,
                    "object": _describe(doc.obj),
                    "outcome": migration.outcome,
                    "replacedBy": migration.replaced_by or None,
                    "changes": [
                        {"path": c.path, "from": c.before, "to": c.after, "reason": c.reason}
                        | ({"toPath": c.target} if c.target else {})
                        for c in migration.changes
                    ],
                    "problems": [{"path": p.path, "message": p.message} for p in migration.problems],
                    "outputs": migration.outputs,
                }
            )
        objects.sort(key=lambda o: o["document"])
        files.append(
            {"source": item.source, "migrated": not _failed(migrations, not_objects), "objects": objects}
        )
    report = {"schemaVersion": JSON_SCHEMA_VERSION, "driver": driver, "files": files}
    sys.stdout.write(dump_json(report))


def _summary(results: list[Any]) -> None:
    counts: dict[str, int] = {}
    for _item, _documents, migrations, not_objects in results:
        counts["failed"] = counts.get("failed", 0) + len(not_objects)
        for migration in migrations:
            counts[migration.outcome] = counts.get(migration.outcome, 0) + 1
    failed_files = sum(1 for _i, _d, m, n in results if _failed(m, n))
    shown = ", ".join(
        f"{counts[k]} {k}" for k in ("migrated", "unchanged", "replaced", "failed") if counts.get(k)
    )
    note = f"; {failed_files} file(s) not written, see the problems above" if failed_files else ""
    print(
        f"{sum(counts.values())} object(s) in {len(results)} file(s): {shown or 'none'}{note}",
        file=sys.stderr,
    )
