"""dra-oracle as a co-process: the real Kubernetes 1.36 DRA code behind JSON lines.

`dra-oracle` (a test dependency only, see ../shared/tools/dra-oracle/README.md) answers one JSON
line per input line and flushes whenever it would block, so one process serves a whole test
session: write a line, read a line. Tests find the binary through DRADRIVER_ORACLE and skip
with one line naming it when it is not set.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

ORACLE_ENV = "DRADRIVER_ORACLE"
SKIP_REASON = (
    f"needs the dra-oracle binary: set {ORACLE_ENV} (.ci/run unpacks it from ../shared/tools/dra-oracle)"
)


def oracle_binary() -> str | None:
    path = os.environ.get(ORACLE_ENV, "")
    return path if path and Path(path).is_file() and os.access(path, os.X_OK) else None


class OracleError(RuntimeError):
    """The oracle rejected a line (`{"error": ...}`) or died."""


class Oracle:
    """One `dra-oracle SUBCOMMAND` process; `ask` sends one request and returns its answer."""

    def __init__(self, binary: str, subcommand: str, *flags: str) -> None:
        self.subcommand = subcommand
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [binary, *flags, subcommand],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        line = json.dumps(request, separators=(",", ":"))
        assert "\n" not in line
        with self._lock:
            stdin, stdout = self._process.stdin, self._process.stdout
            assert stdin is not None
            assert stdout is not None
            try:
                stdin.write(line + "\n")
                stdin.flush()
            except BrokenPipeError:
                raise OracleError(f"dra-oracle {self.subcommand} exited ({self._process.poll()})") from None
            answer = stdout.readline()
        if not answer:
            raise OracleError(f"dra-oracle {self.subcommand} exited ({self._process.poll()})")
        decoded: dict[str, Any] = json.loads(answer)
        return decoded

    def ask_ok(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Like `ask`, but an `error` answer (bad input, internal panic) fails the test."""
        answer = self.ask(request)
        if "error" in answer and not answer.get("timeout"):
            raise OracleError(f"dra-oracle {self.subcommand}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


def start(subcommand: str, *flags: str) -> Iterator[Oracle]:
    """Generator body for a pytest fixture: the co-process, or a skip naming DRADRIVER_ORACLE."""
    binary = oracle_binary()
    if binary is None:
        pytest.skip(SKIP_REASON)
    oracle = Oracle(binary, subcommand, *flags)
    try:
        yield oracle
    finally:
        oracle.close()
