"""Background processes with a log file each, and waiting on a condition while watching them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

#: Lines of a component's log quoted when it fails to come up.
TAIL_LINES = 40


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = TAIL_LINES, start: int = 0) -> str:
    """The last `lines` lines of `path` written after byte offset `start`."""
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


class Component:
    """One long-running process in a session of its own, stdout and stderr appended to `log`."""

    def __init__(self, name: str, argv: list[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = dict(env) if env is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )

    @property
    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL to the whole session after `timeout` seconds."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


class ComponentFailedError(RuntimeError):
    """A component exited or a condition on it was not met in time; the message quotes its log."""


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, component: Component | None = None
) -> None:
    """Poll `condition` until true; fail early, quoting its log, if `component` exits."""
    deadline = time.monotonic() + timeout
    interval = 0.05
    while True:
        if condition():
            return
        if component is not None and component.exited is not None:
            raise ComponentFailedError(
                f"{component.name} exited with {component.exited} while waiting for {what}; "
                f"end of {component.log}:\n{tail(component.log)}"
            )
        if time.monotonic() > deadline:
            log = f"; end of {component.log}:\n{tail(component.log)}" if component else ""
            raise ComponentFailedError(f"timed out after {timeout:.0f}s waiting for {what}{log}")
        time.sleep(interval)
        interval = min(interval * 1.5, 0.5)
