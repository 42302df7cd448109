"""Writing command output as JSON or YAML (fast C dumper when PyYAML has it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """Safe dumper that writes repeated objects out instead of as YAML anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


_DUMPER = _Dumper


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_DUMPER, sort_keys=False, allow_unicode=True, default_flow_style=False)


def dump_yaml_documents(documents: Sequence[Any]) -> str:
    """Multi-document YAML (`---` between documents), as `kubectl create -f` reads it."""
    return yaml.dump_all(
        documents,
        Dumper=_DUMPER,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        explicit_start=True,
    )


class _ManifestDumper(_Dumper):
    """Multi-line strings (scripts, CEL expressions) as literal blocks, as people write manifests."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_ManifestDumper.add_representer(str, _string)


def dump_manifest(data: Any) -> str:
    """One object as YAML for people to read and apply (key order kept, scripts as blocks)."""
    return yaml.dump(
        data, Dumper=_ManifestDumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=110
    )


def write_document(data: Any, fmt: str, *, compact: bool = False) -> None:
    """`-o json` or `-o yaml`: the same document either way, on stdout."""
    import sys

    if fmt == "yaml":
        sys.stdout.write(dump_yaml(data))
    elif compact:  # the C encoder: several times faster than the indenting one on big results
        sys.stdout.write(json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(dump_json(data))
