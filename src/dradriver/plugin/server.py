"""Socket lifecycle of the plugin: one gRPC server on the DRA socket, one on the registration socket.

Start-up follows the Go `kubeletplugin` helper: take the instance lock, remove stale sockets,
serve the DRA socket, then the registration socket (so the DRA services are up by the time the
kubelet reacts to registration). A watchdog re-creates a socket that was deleted under us (the
kubelet's plugin directories wiped), and `stop` drains in-flight calls before removing everything.

Whoever can connect to the DRA socket can prepare claims, so its mode never depends on the
umask: each socket is bound inside a fresh private (0700) directory, set to SOCKET_MODE there,
and only then renamed into place. The lock file is opened without following symlinks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dradriver import logs
from dradriver.files.write import MAX_SOCKET_PATH_BYTES, ensure_directory, error_text
from dradriver.health.board import HealthBoard
from dradriver.plugin.dra import SUPPORTED_SERVICES, DRAService, add_dra_services
from dradriver.plugin.node_instances import NodeLock, NodeLockError
from dradriver.plugin.registration import RegistrationServicer, RegistrationState, add_registration_service

#: sun_path is 108 bytes including the terminating NUL. Each socket is first bound as `s` in a
#: private directory beside it (`.b` and 8 random characters), which must fit too.
_STAGING_PREFIX = ".b"
_STAGED_NAME = "s"
#: The file all instances of the driver on a node lock around prepare/unprepare (as the Go helper).
SERIALIZE_LOCK = "serialize.lock"
#: One instance per state directory (beside the checkpoint), whatever sockets it serves.
STATE_LOCK = "state.lock"
#: gRPC worker threads: prepare/unprepare calls plus one long-lived health stream per kubelet.
MAX_WORKERS = 16
#: How often the watchdog checks that our sockets still exist.
WATCH_INTERVAL_SECONDS = 1.0
#: In-flight calls on a DRA server whose socket vanished get this long before it is torn down.
RESTART_GRACE_SECONDS = 2.0
#: The kubelet (root) is the only client of our sockets.
SOCKET_MODE = 0o600
LOCK_FILE_MODE = 0o644

log = logs.get_logger(component="server")


class StartupError(Exception):
    """The plugin cannot start on these paths (another instance, a foreign file, a bad path)."""


def registration_socket_name(driver_name: str, instance: str = "") -> str:
    """The Go helper's registration socket name: `<driver>-reg.sock`, or with rolling updates
    (`RollingUpdate(podUID)`) `<driver>-<podUID>-reg.sock`."""
    return f"{driver_name}{_suffix(instance)}-reg.sock"


def dra_socket_name(instance: str = "") -> str:
    """The Go helper's DRA socket name: `dra.sock`, or with rolling updates `dra-<podUID>.sock`."""
    return f"dra{_suffix(instance)}.sock"


def _suffix(instance: str) -> str:
    return f"-{instance}" if instance else ""


@dataclass(frozen=True)
class PluginPaths:
    """Where the kubelet expects us; identical inside the container and on the host.

    `instance` is the pod UID when rolling updates are on (two pods of the driver side by side
    on a node during a surge rollout): each has its own sockets and instance lock, and they
    share the plugin directory (checkpoint, `serialize.lock`).
    """

    plugin_dir: Path
    dra_socket: Path
    registration_socket: Path
    lock_file: Path
    #: Beside the checkpoint it guards, wherever the sockets are: exclusive, or with rolling
    #: updates shared by the instances (each with its own `instance_state_lock` beside it).
    state_lock: Path
    instance_state_lock: Path | None = None

    @classmethod
    def for_driver(
        cls,
        driver_name: str,
        plugins_dir: Path,
        registry_dir: Path,
        instance: str = "",
        state_dir: Path | None = None,
    ) -> PluginPaths:
        plugin_dir = plugins_dir / driver_name
        state = state_dir or plugin_dir
        return cls(
            plugin_dir=plugin_dir,
            dra_socket=plugin_dir / dra_socket_name(instance),
            registration_socket=registry_dir / registration_socket_name(driver_name, instance),
            lock_file=plugin_dir / f"serve{_suffix(instance)}.lock",
            state_lock=state / STATE_LOCK,
            instance_state_lock=state / f"{Path(STATE_LOCK).stem}{_suffix(instance)}.lock"
            if instance
            else None,
        )

    @property
    def serialize_lock(self) -> Path:
        """The Go helper's cross-instance lock file (rolling updates): one prepare/unprepare at a time."""
        return self.plugin_dir / SERIALIZE_LOCK

    def check(self) -> None:
        for sock in (self.dra_socket, self.registration_socket):
            if not sock.is_absolute():
                raise StartupError(f"socket path {sock} must be absolute")
            if len(os.fsencode(sock)) > MAX_SOCKET_PATH_BYTES:
                raise StartupError(f"socket path {sock} is longer than {MAX_SOCKET_PATH_BYTES} bytes")
            staged = sock.parent / f"{_STAGING_PREFIX}{'x' * 8}" / _STAGED_NAME
            if len(os.fsencode(staged)) > MAX_SOCKET_PATH_BYTES:
                limit = MAX_SOCKET_PATH_BYTES - (len(os.fsencode(staged)) - len(os.fsencode(sock.parent)))
                raise StartupError(f"socket directory {sock.parent} is longer than {limit} bytes")


@dataclass(frozen=True)
class NodeScope:
    """The node an instance serves, and the root-only directory of its node-wide lock
    (`node_instances`): a second instance of the driver there is refused whatever its directories."""

    name: str
    lock_dir: Path
    #: This instance publishes the node's pool (has cluster access); a node-only one clashes with none.
    publishes: bool


class InstanceLock:
    """An exclusive flock on a file holding our pid: a second instance fails instead of taking
    what the lock guards (`guards`: our sockets, our state directory). A `shared` lock is held by
    every instance of a rolling update together; it holds no pid (each instance's own lock
    beside it does) and is never removed, as others may hold it."""

    def __init__(
        self, path: Path, guards: str = "take over its sockets", *, shared: bool = False, flag: str = ""
    ) -> None:
        self.path = path
        self._guards = guards
        self._shared = shared
        self._flag = flag
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """StartupError (one line, naming the directory's flag if any) if it cannot be taken."""
        try:
            ensure_directory(self.path.parent)
            self._file = self._take()
        except OSError as err:
            where = f"{self._flag} {self.path.parent}: " if self._flag else ""
            raise StartupError(f"{where}cannot take the lock {self.path}: {error_text(err)}") from None

    def _take(self) -> IO[str]:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_FILE_MODE)
            handle = os.fdopen(fd, "r+")
            try:
                fcntl.flock(handle, (fcntl.LOCK_SH if self._shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = ", ".join(_holders(self.path, handle)) or "unknown"
                handle.close()
                raise StartupError(
                    f"another dradriver serve (pid {owner}) holds {self.path}; refusing to {self._guards}"
                ) from None
            # The holder may have unlinked the file between our open and our lock: retry on the new one.
            if self._held_at_path(handle):
                break
            handle.close()
        if not self._shared:
            try:
                os.fchmod(handle.fileno(), LOCK_FILE_MODE)
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
            except OSError:  # a full disk: leave nothing behind
                self.path.unlink(missing_ok=True)
                handle.close()
                raise
        return handle

    def _held_at_path(self, handle: IO[str]) -> bool:
        try:
            return os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            return False

    def still_held(self) -> bool:
        """Whether the file at the path is still the one we lock (its directory was not removed)."""
        return self._file is None or self._held_at_path(self._file)

    def retake(self) -> None:
        """Lock the file anew where it was removed (the directory wiped under us), holding the old
        one until then; StartupError if another instance took it meanwhile."""
        if self._file is None:
            return
        ensure_directory(self.path.parent)
        fresh = self._take()
        self._file.close()
        self._file = fresh

    def release(self) -> None:
        if self._file is None:
            return
        if not self._shared and self._held_at_path(self._file):
            self.path.unlink()  # while still holding the lock, so no one can be racing us
        self._file.close()
        self._file = None


def _holders(path: Path, handle: IO[str]) -> list[str]:
    """The pids of the instances holding the lock at `path`: written in it by an exclusive holder,
    or in the per-instance locks beside it (`<name>-<pod UID>.lock`) by the holders of a shared one."""
    handle.seek(0)
    owners = [handle.read(64).strip()]
    for other in sorted(path.parent.glob(f"{path.stem}-*{path.suffix}")):
        with contextlib.suppress(OSError):
            owners.append(other.read_text()[:64].strip())
    return [owner for owner in owners if owner]


def instance_alive(registry_dir: Path, driver_name: str, instance: str) -> bool:
    """Whether the driver instance `instance` (a pod UID, "" without rolling updates) is serving:
    its registration socket accepts a connection. A crashed instance's stale socket refuses."""
    return _answers(registry_dir / registration_socket_name(driver_name, instance))


def peer_registration_sockets(registry_dir: Path, driver_name: str, own: Path) -> set[Path]:
    """The registration sockets of the driver's other instances on this node."""
    names = {registration_socket_name(driver_name)}
    found = {p for p in registry_dir.glob(registration_socket_name(driver_name, "*")) if p != own}
    found |= {registry_dir / n for n in names if registry_dir / n != own}
    return {p for p in found if _is_socket(p)}


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


class _SocketServer:
    """A gRPC server bound to one unix socket whose inode we remember, so we only ever remove our own."""

    def __init__(self, path: Path, server: grpc.Server) -> None:
        self.path = path
        self.server = server
        _remove_stale_socket(path)
        ensure_directory(path.parent)
        # Bound where nobody else can reach it, given its mode, then moved into place.
        staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=path.parent))
        try:
            bound = staging / _STAGED_NAME
            try:
                server.add_insecure_port(f"unix://{bound}")
            except RuntimeError as err:
                raise StartupError(f"cannot listen on {path}: {err}") from err
            server.start()
            os.chmod(bound, SOCKET_MODE)
            os.rename(bound, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.inode = os.stat(path).st_ino

    def still_there(self) -> bool:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode

    def stop(self, grace: float | None) -> None:
        self.server.stop(grace).wait()
        self.remove()

    def remove(self) -> None:
        if self.still_there():
            self.path.unlink(missing_ok=True)


class _Liveness(health_pb2_grpc.HealthServicer):
    """grpc.health.v1 on the DRA socket, for the probes: it answers from the same server threads
    as the kubelet's calls, but prepares, unprepares and logs nothing."""

    def __init__(self, problem: Callable[[], str | None]) -> None:
        self._problem = problem

    def Check(  # noqa: N802 - the gRPC method name
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = (
            health_pb2.HealthCheckResponse.NOT_SERVING
            if self._problem()
            else health_pb2.HealthCheckResponse.SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


def _remove_stale_socket(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"refusing to replace {path}: it exists and is not a socket")
    log.info("removing stale socket", path=str(path))
    path.unlink()


@dataclass(eq=False)
class PluginServer:
    """Runs the DRA and registration sockets until `stop`."""

    paths: PluginPaths
    driver_name: str
    service: DRAService
    board: HealthBoard
    registration: RegistrationState
    _: KW_ONLY
    watch_interval: float = WATCH_INTERVAL_SECONDS
    node: NodeScope | None = None
    #: Told when another instance took a lock whose file was removed under us (the daemon stops).
    on_lock_lost: Callable[[str], None] = lambda _message: None

    def __post_init__(self) -> None:
        guards, flag = "share its state directory", "--state-dir"
        rolling = self.paths.instance_state_lock is not None
        self._locks: list[InstanceLock | NodeLock] = [
            InstanceLock(self.paths.lock_file),
            InstanceLock(self.paths.state_lock, guards, shared=rolling, flag=flag),
            *(
                [InstanceLock(self.paths.instance_state_lock, guards, flag=flag)]
                if self.paths.instance_state_lock
                else []
            ),
        ]
        if self.node is not None and self.node.publishes:
            # Last: it names the state lock its holders share, which must be ours by then.
            node = NodeLock(
                self.node.lock_dir, self.driver_name, self.node.name, self.paths.state_lock, shared=rolling
            )
            self._locks.append(node)
        self._dra: _SocketServer | None = None
        self._reg: _SocketServer | None = None
        self._stopping = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._restart_lock = threading.Lock()
        self._legacy_kubelet = False
        self._peers: set[Path] = set()

    def legacy_kubelet(self) -> None:
        """The kubelet predates 1.33: it keeps one instance per driver, and forgets the driver
        when any instance's registration socket goes. So when another instance leaves, register
        anew (re-create our registration socket) instead of staying forgotten."""
        with self._restart_lock:
            self._legacy_kubelet = True
            self._peers = self._peer_sockets()

    def _peer_sockets(self) -> set[Path]:
        registry = self.paths.registration_socket.parent
        return peer_registration_sockets(registry, self.driver_name, self.paths.registration_socket)

    def start(self, *, register: bool = True) -> None:
        """Take the lock, serve the DRA socket, then (unless `register` is False: see `register`)
        the registration socket; StartupError (with nothing left behind) if not."""
        self.paths.check()
        for i, lock in enumerate(self._locks):
            try:
                lock.acquire()
            except (StartupError, NodeLockError) as err:
                self._release_locks(self._locks[:i])
                raise StartupError(str(err)) from None
        try:
            self._dra = self._serve_dra()
            if register:
                self._reg = self._serve_registration()
        except BaseException as err:
            self._stop_sockets(grace=0)
            self._release_locks(self._locks)
            if isinstance(err, OSError):
                raise StartupError(f"cannot create the plugin sockets: {err}") from None
            raise
        self._watchdog = threading.Thread(target=self._watch, name="socket-watchdog", daemon=True)
        self._watchdog.start()

    def register(self) -> None:
        """Offer ourselves to the kubelet now (after `start(register=False)`): during a rollout
        the new instance registers only once it can serve, the old one serving meanwhile."""
        with self._restart_lock:
            if self._reg is None and not self._stopping.is_set():
                self._reg = self._serve_registration()

    def peers_serving(self) -> bool:
        """Whether another instance of the driver serves on this node (a rollout is under way)."""
        return any(_answers(p) for p in self._peer_sockets())

    def stop(self, grace: float) -> None:
        """Deregister, let in-flight calls finish for up to `grace` seconds, remove sockets and lock."""
        self._stopping.set()
        if self._watchdog is not None:
            self._watchdog.join()
        self.board.close()  # ends health streams so they do not hold up the drain
        self._stop_sockets(grace)
        self._release_locks(self._locks)

    @staticmethod
    def _release_locks(locks: list[InstanceLock | NodeLock]) -> None:
        for lock in reversed(locks):
            lock.release()

    def abandon(self) -> None:
        """Remove our sockets and lock without waiting for anything: the last act of a process
        that exits with calls still running."""
        for server in (self._reg, self._dra):
            if server is not None:
                server.remove()
        self._release_locks(self._locks)

    def liveness_problem(self) -> str | None:
        """None while both sockets are served (the watchdog restores them within a second)."""
        if self._stopping.is_set():
            return "shutting down"
        if self._watchdog is None or not self._watchdog.is_alive():
            return "socket watchdog is not running"
        return None

    def _stop_sockets(self, grace: float) -> None:
        with self._restart_lock:
            if self._reg is not None:
                self._reg.stop(grace=0)  # the kubelet deregisters as soon as this socket disappears
                self._reg = None
            if self._dra is not None:
                self._dra.stop(grace=grace)
                self._dra = None

    def _serve_dra(self) -> _SocketServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="dra"))
        add_dra_services(server, self.service, self.board)
        health_pb2_grpc.add_HealthServicer_to_server(_Liveness(self.liveness_problem), server)
        return _SocketServer(self.paths.dra_socket, server)

    def _serve_registration(self) -> _SocketServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="registration"))
        servicer = RegistrationServicer(
            self.driver_name, str(self.paths.dra_socket), SUPPORTED_SERVICES, self.registration
        )
        add_registration_service(server, servicer)
        return _SocketServer(self.paths.registration_socket, server)

    def _watch(self) -> None:
        while not self._stopping.wait(self.watch_interval):
            try:
                self._restore_locks()
                self._restore_sockets()
            except (StartupError, NodeLockError) as err:
                log.error("another instance took a lock removed under us: stopping", error=str(err))
                self.on_lock_lost(str(err))
                return
            except Exception:
                log.exception("could not re-create a socket; retrying")

    def _restore_locks(self) -> None:
        """A lock file removed under us (the plugins directory wiped) is locked anew, so that a
        second instance started later still finds us."""
        for lock in self._locks:
            if not lock.still_held():
                log.warning("a lock file was removed; taking it again", path=str(lock.path))
                lock.retake()

    def _restore_sockets(self) -> None:
        with self._restart_lock:
            if self._stopping.is_set() or self._dra is None or self._reg is None:
                return
            dra_lost = not self._dra.still_there()
            if dra_lost:
                log.warning("DRA socket was removed; re-creating it", path=str(self.paths.dra_socket))
                # grpc unlinks whatever socket is at its path when it stops, so stop first, then bind.
                self._dra.stop(grace=RESTART_GRACE_SECONDS)
                self._dra = self._serve_dra()
            peer_left = False
            if self._legacy_kubelet:
                peers = self._peer_sockets()
                peer_left = bool(self._peers - peers)
                self._peers = peers
            if dra_lost or peer_left or not self._reg.still_there():
                # Re-creating the registration socket makes the kubelet register us (and dial) afresh.
                log.warning(
                    "re-creating the registration socket",
                    path=str(self.paths.registration_socket),
                    reason="another instance left and the kubelet (< 1.33) forgot the driver"
                    if peer_left
                    else "a socket was removed",
                )
                self._reg.stop(grace=0)
                self.registration.reset()
                self._reg = self._serve_registration()
