"""`dradriver examples`: the DeviceClasses, example claims and quotas that ship with dradriver.

The same files as the repository's deviceclasses/ (and optional/) and examples/claims/ (and
quotas/), from any installation:
listed without arguments, printed (multi-document YAML) when named.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dradriver.cli import _common

COMMAND = _common.Command(
    help="list or print the built-in DeviceClasses, example claims and example quotas",
    description=(
        "List the DeviceClasses, example claims and quotas that ship with dradriver, or print the\n"
        "named ones.\n"
        "  dradriver examples deviceclasses | kubectl apply -f -\n"
        "  dradriver examples single-gpu > claim.yaml\n"
        "  dradriver validate $(dradriver examples --path)/examples/claims/*.yaml"
    ),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="a file (single-gpu, deviceclasses/gpu.yaml) or a directory (deviceclasses, "
        "deviceclasses/optional, examples/claims, examples/quotas)",
    )
    parser.add_argument("--path", action="store_true", help="print the directory holding the files, and exit")


def builtin_files() -> dict[str, Path]:
    """Relative path (as in the repository) -> file, for every built-in YAML file."""
    from dradriver import data

    return {
        f"{directory}/{path.name}": path
        for directory in data.DIRECTORIES
        for path in sorted((data.ROOT / directory).glob("*.yaml"))
    }


def resolve(name: str, files: dict[str, Path]) -> list[Path]:
    """The files a NAME means: a directory's files, an exact relative path, or a unique file name
    with or without `.yaml`."""
    name = name.strip("/")
    in_directory = [path for rel, path in files.items() if rel.rsplit("/", 1)[0] == name]
    if in_directory:
        return in_directory
    stem = name.removesuffix(".yaml")
    matches = [rel for rel in files if rel == f"{stem}.yaml" or rel.rsplit("/", 1)[1] == f"{stem}.yaml"]
    if len(matches) > 1:
        raise _common.CLIError(f"{name!r} is ambiguous: {', '.join(matches)}")
    if not matches:
        raise _common.CLIError(f"no built-in file {name!r} ('dradriver examples' lists them)")
    return [files[matches[0]]]


def _objects(path: Path) -> str:
    """The file's objects as `Kind/name`."""
    from dradriver.cli._dra_inputs import read_documents

    return ", ".join(f"{doc.obj['kind']}/{doc.obj['metadata']['name']}" for doc in read_documents(str(path)))


def run(args: argparse.Namespace) -> int:
    from dradriver import data

    if args.path:
        print(data.ROOT)
        return 0
    files = builtin_files()
    if not args.names:
        width = max(len(rel) for rel in files)
        for rel, path in files.items():
            print(f"{rel:<{width}}  {_objects(path)}")
        return 0
    paths = [path for name in args.names for path in resolve(name, files)]
    for i, path in enumerate(paths):
        text = path.read_text(encoding="utf-8")
        print(("---\n" if i else "") + text, end="" if text.endswith("\n") else "\n")
    return 0
