"""Applying a claim's sharing settings to its GPUs: the interface and what both backends use.

`SharingControl` is what each GPU backend implements (`backend.nvml.sharing` with the host
driver's tools, `backend.fake.sharing` with the stand-in MPS control daemon of
`dradriver.backend.fake.mps_standin`); both keep the per-claim MPS work in `MpsDaemons`, which the
daemons of shared GPUs (`prepare.gpu_share_daemons`) use too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from dradriver import logs
from dradriver.files.write import MAX_SOCKET_PATH_BYTES
from dradriver.prepare.cdi import ContainerEdits, Mount
from dradriver.prepare.config import Interval, Sharing
from dradriver.quantity import Quantity

MPS_PIPE_IN_CONTAINER = "/tmp/nvidia-mps"
#: Read-write, as run with NVIDIA's MPS client on an H100: that its client works through a
#: read-only pipe directory has not been checked on a GPU yet. Only one namespace's pods share one.
PIPE_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "rbind", "rprivate")
#: The socket the MPS control daemon listens on, and the longest name it binds, in its pipe dir.
MPS_CONTROL_SOCKET = "control"
MPS_LONGEST_SOCKET = "control_privileged"
LISTEN_POLL_SECONDS = 0.005
TOOL_TIMEOUT_SECONDS = 20.0
#: The stand-in control daemon of the fake backend, run by this interpreter (also in the image).
MPS_STANDIN = (sys.executable, "-m", "dradriver.backend.fake.mps_standin")

log = logs.get_logger(component="sharing")


class SharingError(Exception):
    pass


class SharedDevice(Protocol):
    """What sharing needs to know of a prepared device."""

    @property
    def name(self) -> str: ...

    @property
    def uuid(self) -> str: ...


class SharingControl(Protocol):
    def apply(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        """Put the setting into effect for these devices; the edits go into the claim's CDI spec."""
        ...

    def release(self, claim_uid: str, sharing: str, uuids: Sequence[str]) -> None:
        """Undo `apply` (by the description stored in the checkpoint); must tolerate repeats."""
        ...


def timeslice_env(interval: Interval) -> str:
    return f"DRADRIVER_TIMESLICE_INTERVAL={interval}"


def run_tool(argv: Sequence[str], *, env: dict[str, str] | None = None, stdin: str | None = None) -> None:
    """Run a host tool to completion; a failure is a SharingError with its last line of output."""
    try:
        result = subprocess.run(
            argv,
            input=stdin,
            env=env,
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SharingError(f"{argv[0]}: {err}") from err
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise SharingError(f"{' '.join(argv)} failed ({result.returncode}): {detail[-1] if detail else ''}")


def mps_directory(claim_uid: str) -> str:
    """The name of a claim's MPS directory: short, so that the sockets MPS binds in it stay within
    the unix socket path limit (a whole UID under the kubelet's plugin directory does not)."""
    return hashlib.sha256(claim_uid.encode()).hexdigest()[:16]


class MpsDaemons:
    """One MPS control daemon per claim: its directories, start, defaults, container edits, stop.

    `control` is the control tool's argv (NVIDIA's or the stand-in). The daemon runs in the
    foreground (`-f`) as our child, which we reap at stop: daemonized (`-d`), each one that quits
    is left to PID 1 to reap, which in the DaemonSet's container is `serve` (on an H100 node, 30
    MPS claims left 61 processes behind that way).
    """

    def __init__(self, control: Sequence[str], state_dir: Path, host_state_dir: Path | None = None) -> None:
        self._control = list(control)
        self._state_dir = state_dir / "mps"
        self._host_state_dir = (host_state_dir or state_dir) / "mps"
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._running: set[str] = set()
        self._lock = threading.Lock()

    def _env(self, root: Path, uuids: Sequence[str]) -> dict[str, str]:
        return os.environ | {
            "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(root / "log"),
            "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        }

    def start(self, claim_uid: str, sharing: Sharing, devices: Sequence[SharedDevice]) -> ContainerEdits:
        uuids = [d.uuid for d in devices]
        directory = mps_directory(claim_uid)
        env = self._env(self._state_dir / directory, uuids)
        longest = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / MPS_LONGEST_SOCKET
        if len(os.fsencode(longest)) > MAX_SOCKET_PATH_BYTES:
            raise SharingError(
                f"the MPS socket {longest} would be longer than {MAX_SOCKET_PATH_BYTES} bytes: "
                "use a shorter state directory"
            )
        with self._lock:
            if claim_uid in self._running:
                raise SharingError("a claim can use one MPS setting; its requests ask for different ones")
            self._running.add(claim_uid)
        for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        self._spawn(claim_uid, env)
        commands = []
        mps = sharing.mps
        if mps is not None and mps.default_active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {mps.default_active_thread_percentage}")
        for device in devices:
            limit = _pinned_limit(sharing, device)
            if limit is not None:
                commands.append(f"set_default_device_pinned_mem_limit {device.uuid} {limit}")
        if commands:
            run_tool(self._control, env=env, stdin="\n".join(commands) + "\n")
        return ContainerEdits(
            env=(f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}",),
            mounts=(Mount(str(self.host_pipe(claim_uid)), MPS_PIPE_IN_CONTAINER, PIPE_MOUNT_OPTIONS),),
        )

    def host_pipe(self, key: str) -> Path:
        """The pipe directory of `key`'s daemon as the host (the container runtime) sees it."""
        return self._host_state_dir / mps_directory(key) / "pipe"

    def pipe(self, key: str) -> Path:
        """The pipe directory of `key`'s daemon as this process sees it."""
        return self._state_dir / mps_directory(key) / "pipe"

    def running(self, key: str) -> bool:
        """Whether `key`'s daemon answers: our child that has not exited, or one an earlier
        process started (it outlives us, in its own session) whose control socket answers."""
        with self._lock:
            child = self._children.get(key)
        if child is not None:
            return child.poll() is None
        root = self._state_dir / mps_directory(key)
        if not (root / "pipe" / MPS_CONTROL_SOCKET).is_socket():
            return False
        try:
            run_tool(self._control, env=self._env(root, []), stdin="get_default_active_thread_percentage\n")
        except SharingError:
            return False
        with self._lock:
            self._running.add(key)
        return True

    def forget(self, key: str) -> None:
        """Drop what is known of `key`'s daemon (it died: reaped if it was our child)."""
        with self._lock:
            child = self._children.pop(key, None)
            self._running.discard(key)
        if child is not None:
            child.poll()

    def directories(self) -> list[Path]:
        """Every daemon directory under the state directory, running or left behind."""
        if not self._state_dir.is_dir():
            return []
        return sorted(p for p in self._state_dir.iterdir() if p.is_dir())

    def stop_directory(self, root: Path) -> None:
        """Stop the daemon of a directory no key names any more (found at recovery), remove it."""
        self._quit([root], None, root.name)

    def _spawn(self, claim_uid: str, env: dict[str, str]) -> None:
        """Start the control daemon in the foreground, as our child, and wait until it listens."""
        errors_path = Path(env["CUDA_MPS_LOG_DIRECTORY"]) / "daemon.err"
        with open(errors_path, "w") as errors:
            try:
                child = subprocess.Popen(
                    [*self._control, "-f"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=errors,
                    stderr=errors,
                    start_new_session=True,
                )
            except OSError as err:
                raise SharingError(f"{self._control[0]}: {err}") from err
        control = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / MPS_CONTROL_SOCKET
        deadline = time.monotonic() + TOOL_TIMEOUT_SECONDS
        while not control.is_socket():
            try:
                child.wait(LISTEN_POLL_SECONDS)  # returns at once if it exits
            except subprocess.TimeoutExpired:
                if time.monotonic() < deadline:
                    continue
                child.kill()
                child.wait()
            detail = errors_path.read_text().strip().splitlines()
            last = detail[-1] if detail else "no output"
            raise SharingError(f"the MPS control daemon did not start (exit {child.returncode}): {last}")
        with self._lock:
            self._children[claim_uid] = child

    def stop(self, claim_uid: str) -> None:
        with self._lock:
            child = self._children.pop(claim_uid, None)
            self._running.discard(claim_uid)
        # Also the directory named by the whole UID, where earlier versions put it.
        candidates = (self._state_dir / mps_directory(claim_uid), self._state_dir / claim_uid)
        self._quit([r for r in candidates if r.exists()], child, claim_uid)

    def _quit(self, roots: Sequence[Path], child: subprocess.Popen[bytes] | None, claim_uid: str) -> None:
        for root in roots:
            try:
                run_tool(self._control, env=self._env(root, []), stdin="quit\n")
            except SharingError as err:
                log.warning(
                    "could not stop the MPS daemon; removing its directory anyway",
                    claim=claim_uid,
                    error=str(err),
                )
        if child is not None:
            try:
                child.wait(TOOL_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


def _pinned_limit(sharing: Sharing, device: SharedDevice) -> str | None:
    """The pinned-memory limit for a device in the `<MiB>M` form the MPS control daemon takes."""
    mps = sharing.mps
    if mps is None:
        return None
    per_device = mps.per_device_pinned_memory_limit or {}
    text = (
        per_device.get(device.name) or per_device.get(device.uuid) or mps.default_pinned_device_memory_limit
    )
    if text is None:
        return None
    return f"{Quantity.parse(text).as_approximate_float() / 2**20:.0f}M"
