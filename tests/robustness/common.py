"""Shared by the robustness suite: run the real CLI, check one-line failures, snapshot trees."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: A hang is a failure: nothing this suite runs may take anywhere near this long.
HANG_SECONDS = 60
REPO = Path(__file__).resolve().parents[2]


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment without stray DRADRIVER_* settings or cluster access, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DRADRIVER_") and k not in ("KUBECONFIG", "NODE_NAME")
    }
    return env | {"PYTHONUNBUFFERED": "1"} | dict(extra or {})


def dradriver(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m dradriver ARGS` as a real subprocess (a hang fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "dradriver", *args],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        env=clean_env(env),
        cwd=cwd or REPO,
        check=False,
    )


def assert_one_line_failure(result: subprocess.CompletedProcess[str], *needles: str, code: int = 2) -> str:
    """Exit `code`, no traceback, stderr exactly one line containing every needle; returns it."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under `root`: its type, mode and (for files) content hash."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            what = f"-> {os.readlink(path)}"
        else:
            what = stat.filemode(st.st_mode)[0]
        out[str(path.relative_to(root))] = f"{oct(st.st_mode)} {what}"
    return out


def json_lines(text: str) -> list[dict[str, object]]:
    """Every line of a log parsed as JSON (fails on the first line that is not)."""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
    return records
