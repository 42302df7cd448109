"""deploy/monitoring as the tests load it, and the Prometheus tools they run (found on PATH or
through PROMTOOL / PROMETHEUS; a test without one skips and says so)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULE_FILES = sorted(MONITORING.glob("*-rules.yaml"))
#: What Grafana puts in place of the dashboard's variables before it sends a query.
GRAFANA_VARIABLES = {"$instance": ".*", "$__range": "1d", "$__rate_interval": "1m", "$__interval": "15s"}


def tool(name: str) -> str:
    """The path of promtool or prometheus; skips the test where there is none."""
    found = os.environ.get(name.upper()) or shutil.which(name)
    if not found:
        pytest.skip(f"{name} not found (apt-get install prometheus, or set {name.upper()})")
    return found


def dashboard_queries() -> list[str]:
    """Every query of the Grafana dashboard (panels and variables) as Grafana sends it."""
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # label_values(<series>, <label>): Grafana asks for the series
            exprs.append(variable["definition"].removeprefix("label_values(").rsplit(",", 1)[0])
    for variable, value in GRAFANA_VARIABLES.items():
        exprs = [e.replace(variable, value) for e in exprs]
    return exprs
