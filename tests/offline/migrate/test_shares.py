"""NVIDIA's consumable-shares requests (its --consumable-shares memory|unlimited|N) in migrate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.cli import main


def _template(requests: dict[str, Any] | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if requests is not None:
        exactly["capacity"] = {"requests": requests}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "share"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def _migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], requests: dict[str, Any] | None
) -> tuple[int, Any, str]:
    path = tmp_path / "in.yaml"
    path.write_text(yaml.safe_dump(_template(requests)))
    code = main(["migrate", str(path)])
    out, err = capsys.readouterr()
    return code, yaml.safe_load(out) if code == 0 else None, err


def _exactly(document: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = document["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    return exactly


def test_memory_keeps_its_amount(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, document, _ = _migrate(tmp_path, capsys, {"memory": "2Gi"})
    assert code == 0
    assert _exactly(document) == {
        "deviceClassName": "gpu.dradriver.dev",
        "capacity": {"requests": {"memory": "2Gi"}},
    }


def test_one_integer_share_is_the_default_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, document, _ = _migrate(tmp_path, capsys, {"shares": 1})
    assert code == 0
    assert _exactly(document) == {"deviceClassName": "gpu.dradriver.dev"}


def test_an_unlimited_share_needs_nothing_translated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, document, _ = _migrate(tmp_path, capsys, None)
    assert code == 0
    assert _exactly(document) == {"deviceClassName": "gpu.dradriver.dev"}


def test_several_integer_shares_are_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _migrate(tmp_path, capsys, {"shares": 2, "memory": "1Gi"})
    assert code == 2
    (line,) = [line for line in err.splitlines() if "capacity.requests[shares]" in line]
    assert "2 integer shares have no exact equivalent" in line
    assert "memory and computePercent" in line
