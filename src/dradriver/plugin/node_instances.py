"""One instance of the driver per node, whatever its directories: a lock only root can take.

The lock files beside our sockets and state catch a second instance that shares one of those
directories. One given none of them (a second DaemonSet with other hostPaths) would still publish
the same node's pool and hand out the same GPUs. So every instance with cluster access also
locks `<node-lock-dir>/<driver>_<node>.lock`, in a fixed host directory that every DaemonSet of
the driver mounts (`--node-lock-dir`, /run/dradriver) and that only its owner (root) may enter:
no other user's process can hold it, and no process's command line counts.

The instances of a rolling update hold it shared, as they hold their state directory's lock:
the file names the state lock its holders share (device and inode, the same seen from any
container) and the last one's pid, and an instance that holds that very state lock joins them;
any other is refused. Taking, joining and writing the file happen under a second lock (`.guard`)
held for a moment, so that no two instances decide at once.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: Where the DaemonSet mounts the host's /run/dradriver (--node-lock-dir).
DEFAULT_NODE_LOCK_DIR = Path("/run/dradriver")
#: Only the owner (root in the DaemonSet) may create, open or lock anything in the directory.
LOCK_DIR_MODE = 0o700
LOCK_FILE_MODE = 0o600
#: Another instance holds the guard only while it takes or joins the lock.
GUARD_WAIT_SECONDS = 5.0
_GUARD_POLL_SECONDS = 0.01


class NodeLockError(Exception):
    """The lock is held by another instance, or its directory is not ours alone (one line)."""


@dataclass(frozen=True)
class Holders:
    """What the lock file says of its holders."""

    #: `<device>:<inode>` of the state lock they share.
    state_lock_id: str
    pid: str
    state_dir: str

    def text(self) -> str:
        return f"{self.state_lock_id}\n{self.pid}\n{self.state_dir}\n"

    @classmethod
    def parse(cls, text: str) -> Holders:
        """What a holder wrote; unreadable content names nobody (and matches no state lock)."""
        lines = text.splitlines()
        return cls(*lines) if len(lines) == 3 else cls("", "unknown", "unknown")


def file_id(path: Path) -> str:
    st = os.stat(path, follow_symlinks=False)
    return f"{st.st_dev}:{st.st_ino}"


def node_lock_path(lock_dir: Path, driver: str, node: str) -> Path:
    """Driver and node names are DNS names: no slash, nothing to escape."""
    return lock_dir / f"{driver}_{node}.lock"


def ensure_private_directory(path: Path) -> None:
    """Create `path` (mode 0700) or make an existing one ours alone; NodeLockError if it is a
    link, not a directory or another user's."""
    try:
        os.makedirs(path.parent, exist_ok=True)
        os.mkdir(path, LOCK_DIR_MODE)
    except FileExistsError:
        pass
    except OSError as err:
        raise NodeLockError(f"--node-lock-dir {path}: cannot create it: {err.strerror}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NodeLockError(f"--node-lock-dir {path}: not a directory (a link or a file)")
    if st.st_uid != os.geteuid():
        raise NodeLockError(f"--node-lock-dir {path}: owned by uid {st.st_uid}, not by this process's")
    if stat.S_IMODE(st.st_mode) != LOCK_DIR_MODE:
        os.chmod(path, LOCK_DIR_MODE, follow_symlinks=False)


def _open(path: Path) -> IO[str]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_FILE_MODE)
    return os.fdopen(fd, "r+")


def _read(handle: IO[str]) -> Holders:
    handle.seek(0)
    return Holders.parse(handle.read(4096))


def _write(handle: IO[str], holders: Holders) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(holders.text())
    handle.flush()


class NodeLock:
    """The node-wide lock of (`driver`, `node`), beside nothing else of ours: exclusive for
    a plain instance, `shared` with the other instances of a rolling update on `state_lock`
    (which the caller already holds)."""

    def __init__(self, lock_dir: Path, driver: str, node: str, state_lock: Path, *, shared: bool) -> None:
        self.path = node_lock_path(lock_dir, driver, node)
        self._driver = driver
        self._node = node
        self._state_lock = state_lock
        self._shared = shared
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """NodeLockError (one line) if another instance holds it."""
        ensure_private_directory(self.path.parent)
        self._file = self._take()

    def _ours(self) -> Holders:
        return Holders(file_id(self._state_lock), str(os.getpid()), str(self._state_lock.parent))

    def _take(self) -> IO[str]:
        ours = self._ours()
        with self._guard():
            handle = _open(self.path)
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = _read(handle)
                if not (self._shared and held.state_lock_id == ours.state_lock_id):
                    handle.close()
                    raise NodeLockError(
                        f"another dradriver serve of {self._driver} runs on node {self._node} "
                        f"(pid {held.pid}, state directory {held.state_dir}) with a state directory "
                        f"other than {ours.state_dir}: it holds {self.path}; refusing to run a "
                        "second instance on one node"
                    ) from None
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # its holders hold it shared
            _write(handle, ours)
            if self._shared:
                # Not atomic (flock(2)), but under the guard no other instance is deciding.
                fcntl.flock(handle, fcntl.LOCK_SH)
        return handle

    def _guard(self) -> IO[str]:
        """The guard file, locked (a context manager: closing it unlocks)."""
        guard = _open(self.path.with_suffix(".guard"))
        deadline = time.monotonic() + GUARD_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return guard
            except BlockingIOError:
                if time.monotonic() > deadline:
                    guard.close()
                    raise NodeLockError(
                        f"{guard.name} stayed locked for {GUARD_WAIT_SECONDS:.0f} s; is another "
                        "dradriver serve hung while starting?"
                    ) from None
                time.sleep(_GUARD_POLL_SECONDS)

    def still_held(self) -> bool:
        """Whether the file at the path is still the one we lock (its directory was not removed)
        and names our state lock (which is taken anew when the plugins directory is removed)."""
        if self._file is None:
            return True
        try:
            return self._same_file() and _read(self._file).state_lock_id == file_id(self._state_lock)
        except FileNotFoundError:
            return False

    def _same_file(self) -> bool:
        assert self._file is not None
        st = os.fstat(self._file.fileno())
        try:
            return file_id(self.path) == f"{st.st_dev}:{st.st_ino}"
        except FileNotFoundError:
            return False

    def retake(self) -> None:
        """Lock the file anew where it was removed, holding the old one until then; or name our
        state lock in it again."""
        if self._file is None:
            return
        if self._same_file():
            with self._guard():
                _write(self._file, self._ours())
            return
        ensure_private_directory(self.path.parent)
        fresh = self._take()
        self._file.close()
        self._file = fresh

    def release(self) -> None:
        """The file stays: a rollout's other instance may hold it, and it names nobody once unlocked."""
        if self._file is not None:
            self._file.close()
            self._file = None
