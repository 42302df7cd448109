"""The table of `dradriver migrate` cases (cases.yaml here): one row per spec and fake profile.

Read by test_specs.py (migrate, validate and dry-run per row) and by the real-cluster e2e
(tests/e2e/test_migrate.py), which runs the rows on a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NotRequired, TypedDict

import yaml

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"

Phase = Literal["Running", "Succeeded", "Pending"]


class Case(TypedDict):
    spec: str
    expected: Literal["satisfiable", "unsatisfiable", "migrate-error"]
    why: str
    profile: NotRequired[str]
    reason: NotRequired[str]
    pods: NotRequired[dict[Phase, int]]
    needsGpu: NotRequired[bool]


def cases() -> list[Case]:
    rows: list[Case] = yaml.safe_load((HERE / "cases.yaml").read_text())
    return rows


def row_id(row: Case) -> str:
    """Unique per row: the spec's path under fixtures/ without `.yaml`, and the profile."""
    return f"{row['spec'].removesuffix('.yaml')}@{row.get('profile', 'migrate')}"
