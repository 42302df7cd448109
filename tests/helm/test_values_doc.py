"""docs/helm-values.md is what scripts/helm_values_doc.py makes of the chart's schema and defaults
(every value of values.yaml is in the schema: `helm lint --strict` refuses an unknown one)."""

from __future__ import annotations

from scripts.helm_values_doc import PAGE, generate


def test_committed_values_reference_is_generated_from_the_schema() -> None:
    assert PAGE.read_text() == generate(), (
        "docs/helm-values.md is out of date: run scripts/helm_values_doc.py"
    )
