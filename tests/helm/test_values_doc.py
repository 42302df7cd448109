"""The generated parts of the chart's documentation and schema are current: docs/helm-values.md
(scripts/helm_values_doc.py; every value of values.yaml is in the schema, as `helm lint
--strict` refuses an unknown one) and the health policy's schema in values.schema.json
(scripts/helm_schema.py)."""

from __future__ import annotations

import json

from scripts.helm_schema import SCHEMA, render, with_health_config
from scripts.helm_values_doc import PAGE, generate


def test_committed_values_reference_is_generated_from_the_schema() -> None:
    assert PAGE.read_text() == generate(), (
        "docs/helm-values.md is out of date: run scripts/helm_values_doc.py"
    )


def test_schema_holds_the_health_policy_as_serve_checks_it() -> None:
    current = SCHEMA.read_text()
    assert current == render(with_health_config(json.loads(current))), (
        "values.schema.json's serve.healthConfig is stale: run scripts/helm_schema.py"
    )
