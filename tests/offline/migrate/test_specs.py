"""NVIDIA's GPU and MIG specs and device-plugin workloads, through `dradriver migrate`, then the
API's OpenAPI schemas, `validate` and `dry-run` on the fake profile each is meant for
(tests/offline/migrate/cases.yaml).

Everything runs through the real CLI entry point. Running the migrated specs on a cluster is the
e2e harness's part; README.md here says what it takes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dradriver.backend.select import builtin_profile_names
from dradriver.cli import main
from tests.deploy.manifests import KUBERNETES_VERSIONS, PROFILE_FLAGS
from tests.deploy.test_schemas import validate as validate_schema
from tests.offline.migrate.table import FIXTURES, Case, cases, row_id

OUTCOMES = {"satisfiable": 0, "unsatisfiable": 1}
FIELDS = {"spec", "profile", "expected", "reason", "pods", "needsGpu", "why"}
PHASES = {"Running", "Succeeded", "Pending"}


def test_the_table_covers_every_fixture_with_valid_rows() -> None:
    profiles = set(builtin_profile_names())
    rows = cases()
    for row in rows:
        where = row_id(row)
        assert set(row) <= FIELDS, f"{where}: unknown fields {set(row) - FIELDS}"
        assert (FIXTURES / row["spec"]).is_file(), f"{where}: no such fixture"
        assert row.get("why"), f"{where}: say what the row shows"
        if row["expected"] == "migrate-error":
            assert row.get("reason"), f"{where}: name the problem migrate reports"
            assert "profile" not in row, f"{where}: a refused spec runs nowhere"
            assert "pods" not in row, f"{where}: a refused spec runs nowhere"
        else:
            assert row["expected"] in OUTCOMES, f"{where}: expected {row['expected']!r}"
            profile, *flags = str(row.get("profile")).split()
            assert profile in profiles, f"{where}: unknown profile {profile}"
            assert set(flags) <= PROFILE_FLAGS, f"{where}: unknown serve flags {flags}"
            assert set(row["pods"]) <= PHASES, f"{where}: pod phases {set(row['pods'])}"
            if row["expected"] == "unsatisfiable":
                assert set(row["pods"]) == {"Pending"}, f"{where}: nothing runs where nothing fits"
    files = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.yaml")}
    assert files == {row["spec"] for row in rows}, (
        f"fixtures without a row: {files - {r['spec'] for r in rows}}"
    )
    assert {row["expected"] for row in rows} == {*OUTCOMES, "migrate-error"}
    pairs = [(row["spec"], row.get("profile")) for row in rows]
    assert len(pairs) == len(set(pairs)), "a spec and profile appear twice"


def test_nvidia_specs_keep_their_license_notice() -> None:
    nvidia = FIXTURES / "nvidia"
    assert "Apache License" in (nvidia / "LICENSE").read_text()
    notice = (nvidia / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice
    assert "95932046683719c43b6a0dd9613c2e5aad5d6703" in notice


@pytest.mark.parametrize("row", cases(), ids=row_id)
def test_spec_migrates_and_gives_the_expected_verdict(
    row: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = str(FIXTURES / row["spec"])
    code = main(["migrate", spec])
    out, err = capsys.readouterr()
    if row["expected"] == "migrate-error":
        assert code == 2, out + err
        assert row["reason"] in err
        # One line per problem, naming the file, document, object and field.
        assert all(line.startswith(f"{spec}:") for line in err.splitlines()[:-1]), err
        assert out == f"# dradriver migrate: {spec}: not migrated: it has problems (listed on stderr)\n"
        return
    assert code == 0, err
    manifest = [line for line in out.splitlines() if not line.startswith("#")]
    assert not [line for line in manifest if "gpu.nvidia.com" in line or "resource.nvidia.com" in line]
    for document in yaml.safe_load_all(out):
        for version in KUBERNETES_VERSIONS:  # every object, workloads too, is valid for the API server
            validate_schema(document, version, row["spec"])
    migrated = tmp_path / "migrated.yaml"
    migrated.write_text(out)
    assert main(["validate", str(migrated)]) == 0, capsys.readouterr()
    capsys.readouterr()
    code = main(["dry-run", "--claim", str(migrated), "--fake-gpus", *row["profile"].split(), "-o", "json"])
    report = capsys.readouterr().out
    assert code == OUTCOMES[row["expected"]], report
