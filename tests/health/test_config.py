"""The health config file: defaults, overrides, and one-line errors naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dradriver.health.config import HealthConfig, HealthConfigError, load_health_config
from dradriver.health.xid import XidClass


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "health.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = HealthConfig()
    assert config.enabled
    assert config.xids == {}
    assert config.unlisted_xids is XidClass.FATAL
    assert config.quiet_period_seconds == 300
    assert config.recheck_interval_seconds == 30
    assert config.taint_effect == "NoSchedule"
    assert not config.thresholds.enabled


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_health_config(write(tmp_path, "# nothing\n")) == HealthConfig()


def test_every_setting(tmp_path: Path) -> None:
    config = load_health_config(
        write(
            tmp_path,
            """
xids: {13: fatal, "94": application, 63: informational}
unlistedXids: informational
quietPeriodSeconds: 60
recheckIntervalSeconds: 5
taintEffect: NoExecute
thresholds: {temperatureCelsius: 90, uncorrectedEccErrors: 1, pollIntervalSeconds: 10}
enabled: false
""",
        )
    )
    assert config.xids == {13: XidClass.FATAL, 94: XidClass.APPLICATION, 63: XidClass.INFORMATIONAL}
    assert config.unlisted_xids is XidClass.INFORMATIONAL
    assert (config.quiet_period_seconds, config.recheck_interval_seconds) == (60, 5)
    assert config.taint_effect == "NoExecute"
    assert config.thresholds.enabled
    assert config.thresholds.temperature_celsius == 90
    assert not config.enabled


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("quietPeriod: 5\n", "quietPeriod: Extra inputs are not permitted"),
        ("xids: {79: broken}\n", "xids.79: Input should be 'fatal', 'application' or 'informational'"),
        ("xids: {seventy: fatal}\n", "xids.seventy.[key]: Input should be a valid integer"),
        ("taintEffect: None\n", "taintEffect: Input should be 'NoSchedule' or 'NoExecute'"),
        ("recheckIntervalSeconds: 0\n", "recheckIntervalSeconds: Input should be greater than 0"),
        (
            "quietPeriodSeconds: 300000000\n",
            "quietPeriodSeconds: Input should be less than or equal to 604800",
        ),
        (
            "thresholds: {temperatureCelsius: -1}\n",
            "thresholds.temperatureCelsius: Input should be greater than 0",
        ),
        ("- 1\n", "must be a mapping of settings, not list"),
        ("xids: [\n", "invalid YAML"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, text: str, error: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(HealthConfigError) as caught:
        load_health_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert error in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(HealthConfigError, match="No such file or directory"):
        load_health_config(tmp_path / "absent.yaml")


def test_serve_refuses_a_bad_config_before_starting(tmp_path: Path) -> None:
    path = write(tmp_path, "taintEffect: Evict\n")
    result = subprocess.run(
        [sys.executable, "-m", "dradriver", "serve", "--fake-gpus", "t4x4", "--health-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()  # serve logs JSON from its first line
    record = json.loads(line)
    assert record["level"] == "error"
    assert record["event"] == (
        f"--health-config {path}: taintEffect: Input should be 'NoSchedule' or 'NoExecute'"
    )
