"""The real Kubernetes 1.36 allocator (`dra-oracle allocate`, see ../shared/tools/dra-oracle) as a
co-process, for checking partitionable layouts against the scheduler's own code.

Tests find the binary through DRADRIVER_ORACLE and skip with one line without it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ORACLE_ENV = "DRADRIVER_ORACLE"
Json = dict[str, Any]


class Oracle:
    def __init__(self, binary: Path) -> None:
        self._proc = subprocess.Popen(
            [str(binary), "allocate"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def allocate(
        self, *, node: str, classes: list[Json], slices: list[Json], claims: list[Json], allocated: list[Json]
    ) -> Json:
        """One `allocate` line: {"results": [...]}, {"unsatisfiable": true, ...} or {"error": ...}."""
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        line = {
            "node": {"metadata": {"name": node}},
            "deviceClasses": classes,
            "resourceSlices": slices,
            "claims": claims,
            "allocatedClaims": allocated,
        }
        self._proc.stdin.write(json.dumps(line) + "\n")
        self._proc.stdin.flush()
        answer: Json = json.loads(self._proc.stdout.readline())
        return answer

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(10)


def oracle_binary() -> Path:
    path = os.environ.get(ORACLE_ENV)
    if not path or not Path(path).is_file():
        pytest.skip(f"needs the real allocator: set {ORACLE_ENV} to a dra-oracle binary")
    return Path(path)
