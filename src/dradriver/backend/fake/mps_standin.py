"""A stand-in for `nvidia-cuda-mps-control`, so that MPS claims prepare on the fake GPU backend.

    python -m dradriver.backend.fake.mps_standin -f    # the control daemon, in the foreground
    python -m dradriver.backend.fake.mps_standin       # a client: commands on stdin, one per line

It behaves like NVIDIA's tool where the driver depends on it: the daemon takes its pipe and log
directories from CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY, listens on `<pipe>/control`,
sees only the GPUs in CUDA_VISIBLE_DEVICES, takes `set_default_active_thread_percentage`,
`set_default_device_pinned_mem_limit` (and their `get_` forms) and stops on `quit`. For the
shares of a shared GPU (serve --gpu-shares), where each CUDA client brings its own limits in its
environment, it also keeps a register of clients and their limits (`set_client_limits <client>
<percentage> <limit>`, `remove_client <client>`, `get_client_limits <client>`), since no CUDA
client ever connects to it; a client exits non-zero when the daemon is unreachable or refuses a
command. It runs no CUDA: what it was told is written to `<pipe>/dradriver-mps-standin.json`,
which a workload sees in its bind-mounted pipe directory; the write follows no link planted there.

Standard library only (it starts as a separate process, also inside the DaemonSet image).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

CONTROL_SOCKET = "control"
BINDING_SOCKET = ".control.binding"
STATE_FILE = "dradriver-mps-standin.json"
_LIMIT = re.compile(r"[1-9]\d*[MG]")


class _StopRequestedError(Exception):
    """`quit` or SIGTERM: leave the accept loop and clean up."""


class Daemon:
    """The control daemon's settings and the commands that change them."""

    def __init__(self, pipe_dir: Path, devices: list[str]) -> None:
        self.pipe_dir = pipe_dir
        self.devices = devices
        self.thread_percentage = 100
        self.pinned_limits: dict[str, str] = {}
        self.clients: dict[str, dict[str, str | int]] = {}

    def handle(self, line: str) -> str:
        """The reply to one command line: a value, `ok`, or `error: ...`."""
        words = line.split()
        command, args = (words[0], words[1:]) if words else ("", [])
        if command == "set_default_active_thread_percentage" and len(args) == 1:
            if not args[0].isdigit() or not 0 < int(args[0]) <= 100:
                return f"error: active thread percentage {args[0]!r} is not 1..100"
            self.thread_percentage = int(args[0])
        elif command == "get_default_active_thread_percentage" and not args:
            return str(self.thread_percentage)
        elif command == "set_default_device_pinned_mem_limit" and len(args) == 2:
            uuid, limit = args
            if uuid not in self.devices:
                return f"error: device {uuid} is not visible to this daemon"
            if not _LIMIT.fullmatch(limit):
                return f"error: pinned memory limit {limit!r} is not <N>M or <N>G"
            self.pinned_limits[uuid] = limit
        elif command == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return self.pinned_limits.get(args[0], "none")
        elif command == "set_client_limits" and len(args) == 3:
            client, percentage, limit = args
            if not percentage.isdigit() or not 0 < int(percentage) <= 100:
                return f"error: active thread percentage {percentage!r} is not 1..100"
            if not _LIMIT.fullmatch(limit):
                return f"error: pinned memory limit {limit!r} is not <N>M or <N>G"
            self.clients[client] = {"activeThreadPercentage": int(percentage), "pinnedDeviceMemLimit": limit}
        elif command == "remove_client" and len(args) == 1:
            self.clients.pop(args[0], None)
        elif command == "get_client_limits" and len(args) == 1:
            limits = self.clients.get(args[0])
            return (
                "none"
                if limits is None
                else f"{limits['activeThreadPercentage']} {limits['pinnedDeviceMemLimit']}"
            )
        elif command == "quit" and not args:
            raise _StopRequestedError
        else:
            return f"error: unknown command {line.strip()!r}"
        self.save()
        return "ok"

    def save(self) -> None:
        state = {
            "pid": os.getpid(),
            "devices": self.devices,
            "defaultActiveThreadPercentage": self.thread_percentage,
            "defaultDevicePinnedMemLimit": self.pinned_limits,
            "clients": self.clients,
        }
        # Through the directory's descriptor, created afresh (O_EXCL) and renamed: a link planted
        # in the pipe directory is replaced, never followed.
        temporary = f".{STATE_FILE}.tmp"
        directory = os.open(self.pipe_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=directory)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with open(os.open(temporary, flags, 0o644, dir_fd=directory), "w") as out:
                out.write(json.dumps(state, indent=2) + "\n")
            os.replace(temporary, STATE_FILE, src_dir_fd=directory, dst_dir_fd=directory)
        finally:
            os.close(directory)


def _lines(conn: socket.socket) -> Iterator[str]:
    buffered = b""
    while chunk := conn.recv(4096):
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield line.decode("utf-8", "replace")


def _serve(daemon: Daemon, server: socket.socket, log: Path) -> None:
    while True:
        conn, _ = server.accept()
        with conn:
            for line in _lines(conn):
                if not line.strip():
                    continue
                try:
                    reply = daemon.handle(line)
                except _StopRequestedError:
                    conn.sendall(b"ok\n")
                    raise
                with log.open("a") as out:
                    out.write(f"{line.strip()} -> {reply}\n")
                conn.sendall(reply.encode() + b"\n")


def _on_term(_signum: int, _frame: FrameType | None) -> None:
    raise _StopRequestedError


def run_daemon() -> int:
    pipe_dir = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])
    log_dir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", pipe_dir))
    devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    daemon = Daemon(pipe_dir, devices)
    # A relative socket path: unix socket paths are limited to 107 bytes, state dirs need not be.
    os.chdir(pipe_dir)
    signal.signal(signal.SIGTERM, _on_term)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        daemon.save()  # before the socket, which is what says the daemon is ready
        Path(CONTROL_SOCKET).unlink(missing_ok=True)
        # Bound under another name and renamed once listening: a client that sees the socket
        # can connect (between bind and listen it would be refused).
        server.bind(BINDING_SOCKET)
        server.listen()
        os.replace(BINDING_SOCKET, CONTROL_SOCKET)
        _serve(daemon, server, log_dir / "control.log")
    except _StopRequestedError:
        pass
    finally:
        server.close()
        for name in (
            CONTROL_SOCKET,
            BINDING_SOCKET,
            STATE_FILE,
            f".{STATE_FILE}.tmp",
        ):  # a save SIGTERM cut short
            Path(name).unlink(missing_ok=True)
    return 0


def run_client() -> int:
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    commands = [line for line in sys.stdin.read().splitlines() if line.strip()]
    failed = False
    try:
        os.chdir(pipe_dir)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(CONTROL_SOCKET)
            replies = conn.makefile("r", encoding="utf-8")
            for command in commands:
                conn.sendall(command.encode() + b"\n")
                reply = replies.readline().strip()
                if reply.startswith("error:"):
                    print(reply, file=sys.stderr)
                    failed = True
                elif reply != "ok":
                    print(reply)
    except OSError as err:
        print(f"cannot reach the MPS control daemon in {pipe_dir}: {err.strerror or err}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv == ["-f"]:
        return run_daemon()
    if not argv:
        return run_client()
    print("usage: mps_standin [-f]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
