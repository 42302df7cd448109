"""The chart's values.schema.json holds the GPU health policy's schema (serve.healthConfig) as
`dradriver serve --health-config` checks it (dradriver.health.config.HealthConfig), so that a
misspelt or mistyped health setting is refused at `helm install`, not by a crash-looping pod.

Usage: helm_schema.py [--check]
Rewrites deploy/helm/dradriver/values.schema.json; with --check, exits 1 when it is out of date.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from dradriver.health.config import HealthConfig

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "deploy/helm/dradriver/values.schema.json"
#: The prefix of the health model's definitions among the schema's root $defs.
PREFIX = "health"


def without_titles(node: Any) -> Any:
    """pydantic's generated titles ("Quietperiodseconds") say nothing the names do not."""
    if isinstance(node, dict):
        return {k: without_titles(v) for k, v in node.items() if k != "title" or not isinstance(v, str)}
    if isinstance(node, list):
        return [without_titles(v) for v in node]
    return node


def rebased(node: Any) -> Any:
    """References to the model's $defs, pointed at the same definitions in the root $defs."""
    if isinstance(node, dict):
        return {
            k: f"#/$defs/{PREFIX}{v.removeprefix('#/$defs/')}" if k == "$ref" else rebased(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [rebased(v) for v in node]
    return node


def with_health_config(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with serve.healthConfig and its definitions as the model has them now."""
    model = rebased(without_titles(HealthConfig.model_json_schema(by_alias=True)))
    definitions = model.pop("$defs")
    serve = schema["properties"]["serve"]["properties"]
    description = serve["healthConfig"]["description"]
    updated: dict[str, Any] = copy.deepcopy(schema)
    updated["properties"]["serve"]["properties"]["healthConfig"] = {"description": description, **model}
    kept = {k: v for k, v in schema.get("$defs", {}).items() if not k.startswith(PREFIX)}
    updated["$defs"] = kept | {f"{PREFIX}{name}": value for name, value in definitions.items()}
    return updated


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when values.schema.json is out of date")
    args = parser.parse_args()
    current = SCHEMA.read_text()
    wanted = render(with_health_config(json.loads(current)))
    if args.check:
        if current != wanted:
            print(f"{SCHEMA.relative_to(REPO)} is out of date: run scripts/helm_schema.py", file=sys.stderr)
            return 1
        return 0
    SCHEMA.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
