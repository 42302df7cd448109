"""docs/helm-values.md from the chart's values.schema.json (names, types, allowed values and
descriptions) and values.yaml (defaults): the reference cannot drift from what Helm checks.

Usage: helm_values_doc.py [--check]
Rewrites docs/helm-values.md; with --check, exits 1 when the committed page differs instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "deploy/helm/dradriver"
PAGE = REPO / "docs/helm-values.md"

HEADER = """# Helm values reference

Every value of the `dradriver` chart (`deploy/helm/dradriver`), with its type, default and
meaning. Helm checks each value against the chart's `values.schema.json` at `helm install`,
`helm upgrade` and `helm template`: a value of the wrong type, outside its allowed values, or a
misspelt name is refused with one error naming it. [Installing with Helm](helm.md) shows the
values in use.

Generated from `values.schema.json` and `values.yaml` by `scripts/helm_values_doc.py`; do not
edit by hand.
"""


#: Schema keywords shown beside a type, and how.
BOUNDS = (("minimum", "min"), ("maximum", "max"), ("minLength", "min length"), ("maxLength", "max length"))


def schema_type(node: dict[str, Any]) -> str:
    kind = node.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    text = " or ".join(kinds)
    if "enum" in node:
        text += ": " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    bounds = [
        f"{word} {node[key]}"
        for key, word in (
            ("minimum", "min"),
            ("maximum", "max"),
            ("minLength", "min length"),
            ("maxLength", "max length"),
        )
        if key in node
    ]
    if bounds:
        text += " (" + ", ".join(bounds) + ")"
    return text


def default_text(value: Any) -> str:
    if value is None:
        return "`null`"
    return "`" + json.dumps(value, separators=(", ", ": ")).replace("|", "\\|") + "`"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def rows(node: dict[str, Any], values: Any, prefix: str) -> Iterator[str]:
    """One table row a value; objects with named properties are walked into, unless values.yaml
    leaves them empty (serve.healthConfig: one row naming its settings)."""
    for name, child in node.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        default = values.get(name) if isinstance(values, dict) else None
        settings = child.get("properties", {})
        if child.get("type") == "object" and settings and default != {}:
            yield from rows(child, default, path)
            continue
        description = cell(child.get("description", ""))
        if settings:  # a map values.yaml leaves empty, with a schema of its own
            description += " Settings: " + ", ".join(f"`{key}`" for key in settings) + "."
        yield f"| `{path}` | {cell(schema_type(child))} | {default_text(default)} | {description} |"


def render_page(schema: dict[str, Any], values: dict[str, Any]) -> str:
    """The page: a section a top-level value group, in the schema's order."""
    out = [HEADER.rstrip()]
    table = "| value | type | default | description |\n| --- | --- | --- | --- |"
    loose = []
    for name, child in schema["properties"].items():
        if child.get("type") == "object" and "properties" in child:
            body = "\n".join(rows(child, values.get(name), name))
            out.append(f"## `{name}`\n\n{cell(child.get('description', ''))}\n\n{table}\n{body}")
        elif name != "global":  # Helm's own, for parent charts
            loose.append(name)
    general = {"properties": {name: schema["properties"][name] for name in loose}}
    out.insert(1, f"## General\n\n{table}\n" + "\n".join(rows(general, values, "")))
    return "\n\n".join(out) + "\n"


def generate() -> str:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return render_page(schema, values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed page differs")
    args = parser.parse_args()
    page = generate()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(REPO)} is out of date: run scripts/helm_values_doc.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(exist_ok=True)
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
