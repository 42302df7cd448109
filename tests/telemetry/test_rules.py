"""deploy/monitoring loaded into the real Prometheus tooling: `promtool check rules` on every rule
file, `promtool test rules` with a unit test (tests/telemetry/rules/) for every recording and
alerting rule, and every query of the Grafana dashboard parsed by Prometheus' own parser."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.telemetry.monitoring import RULE_FILES, dashboard_queries, tool

UNIT_TESTS = Path(__file__).resolve().parent / "rules"


def run_promtool(*args: str | Path) -> str:
    done = subprocess.run(
        [tool("promtool"), *map(str, args)], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rules() -> list[dict[str, str]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def test_the_rule_files_pass_promtool_check_rules() -> None:
    out = run_promtool("check", "rules", *RULE_FILES)
    assert out.count("SUCCESS") == len(RULE_FILES)


def test_every_rule_has_a_promtool_unit_test_and_they_pass() -> None:
    tests = [yaml.safe_load(path.read_text()) for path in sorted(UNIT_TESTS.glob("*.test.yaml"))]
    loaded = {(UNIT_TESTS / f).resolve() for test in tests for f in test["rule_files"]}
    assert loaded == {path.resolve() for path in RULE_FILES}
    tested_exprs = [e["expr"] for t in tests for case in t["tests"] for e in case.get("promql_expr_test", [])]
    tested_alerts = {
        a["alertname"] for t in tests for case in t["tests"] for a in case.get("alert_rule_test", [])
    }
    for rule in rules():
        if "record" in rule:
            assert any(
                re.search(rf"(?<![\w:]){re.escape(rule['record'])}(?![\w:])", e) for e in tested_exprs
            ), rule
        else:
            assert rule["alert"] in tested_alerts, rule
    # Every alert is also tested where it must not fire (an empty exp_alerts).
    quiet = {
        a["alertname"]
        for t in tests
        for case in t["tests"]
        for a in case.get("alert_rule_test", [])
        if not a["exp_alerts"]
    }
    assert quiet == tested_alerts
    out = run_promtool("test", "rules", *sorted(UNIT_TESTS.glob("*.test.yaml")))
    assert "FAILED" not in out


def test_every_dashboard_query_parses_in_prometheus(tmp_path: Path) -> None:
    exprs = dashboard_queries()
    # promtool parses a rule's expression with Prometheus' PromQL parser: a query that would be a
    # 400 from /api/v1/query fails the check and names itself.
    as_rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"q{n}", "expr": e} for n, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(as_rules))
    assert f"SUCCESS: {len(exprs)} rules found" in run_promtool("check", "rules", path)
