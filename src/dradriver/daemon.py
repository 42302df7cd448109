"""`dradriver serve`: assembles the node daemon around the plugin server and runs it until a signal.

The sockets come up first, with only grpc and the generated code loaded; everything heavier
(discovery, the Kubernetes client, pydantic models) is built afterwards in the background while
the kubelet can already register us. Calls that arrive before that finishes wait for it.

With `pod_uid` set (rolling updates) this is one of possibly two instances on the node: its
sockets and instance lock carry the pod UID, prepare/unprepare take the node-wide
`serialize.lock`, and slices are handed over by marker (`publish.handover`). The device set is
live (`inventory`): rescans, NVML MIG events and fake profile changes republish it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from dradriver import __version__, logs
from dradriver.files.write import StorageError
from dradriver.health.board import HealthBoard
from dradriver.kube.client import pick_config_source
from dradriver.plugin.dra import DRAService
from dradriver.plugin.driver import CallError
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.server import NodeScope, PluginPaths, PluginServer, StartupError
from dradriver.probes import ProbeServer
from dradriver.serve_config import ServeConfig
from dradriver.signals import STOP_SIGNALS, pending_stop_signal

if TYPE_CHECKING:
    from dradriver.wiring import Parts

__all__ = ["Daemon", "ServeConfig"]
#: After --shutdown-grace, this long for the last clean-up before the process exits regardless.
HARD_EXIT_MARGIN_SECONDS = 0.5

log = logs.get_logger(component="daemon")


class Daemon:
    """The running node daemon; `run` blocks until SIGTERM/SIGINT or a fatal error."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.board = HealthBoard()
        self.registration = RegistrationState()
        #: What start-up builds once the sockets are up (`wiring`); done once it is all running.
        #: Calls wait for it (`DRAService`); a start-up that fails sets the error they answer.
        self._parts: Future[Parts] = Future()
        self.paths = PluginPaths.for_driver(
            config.driver_name, config.plugins_dir, config.registry_dir, config.pod_uid, config.state_dir
        )
        #: Orders this instance among the node's instances (slice handover): they share a clock.
        self.started_ns = time.time_ns()
        self.service = DRAService(self._parts)
        self.server = PluginServer(
            self.paths,
            config.driver_name,
            self.service,
            self.board,
            self.registration,
            node=NodeScope(
                config.node_name,
                config.node_lock_dir,
                publishes=pick_config_source(config.kubeconfig, os.environ, Path.home()) is not None,
            ),
            on_lock_lost=self._fail,
        )
        self._stop = threading.Event()
        self._fatal = ""
        self._signal: str | None = None
        # What start-up has started, stopped in reverse order; guarded so that a signal at any
        # moment of start-up stops exactly what runs (see `started`).
        self._lifecycle = threading.Lock()
        self._stopping = False
        self._stops: list[tuple[str, Callable[[], None]]] = []

    def run(self) -> int:
        # Before anything binds: a SIGTERM during start-up must still clean up.
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        if (early := pending_stop_signal()) is not None:
            self._on_signal(early, None)
        # A rollout: the old instance serves until this one can; only then does the kubelet see us.
        defer = bool(self.config.pod_uid) and self.server.peers_serving()
        try:
            self.server.start(register=not defer)
        except StartupError as err:
            self._report_fatal(str(err))
            return 1
        logs.configure(self.config.log_format, self.config.verbosity)
        log.info(
            "plugin sockets are up",
            version=__version__,
            driver=self.config.driver_name,
            node=self.config.node_name,
            dra_socket=str(self.paths.dra_socket),
            registration_socket=str(self.paths.registration_socket),
            rolling_update=bool(self.config.pod_uid),
        )
        probes = None
        try:
            probes = self._start_probes()
        except OSError as err:  # the port is taken, or the address is not ours
            self._fail(
                f"--metrics-address {self.config.metrics_address}: cannot listen: {err.strerror or err}"
            )
        else:
            threading.Thread(target=self._initialize, args=(defer,), name="initialize", daemon=True).start()
        while not self._stop.wait(1.0):
            pass
        return self._shutdown(probes)

    def _shutdown(self, probes: ProbeServer | None) -> int:
        """Stop everything within --shutdown-grace; whatever is still stuck then (a call blocked
        on I/O) cannot keep the process: it is gone within the grace plus one second."""
        grace = self.config.shutdown_grace
        deadline = time.monotonic() + grace
        code = 1 if self._fatal else 0
        _hard_exit_after(deadline + HARD_EXIT_MARGIN_SECONDS, code, self.server.abandon)
        log.info("shutting down", signal=self._signal, grace_seconds=grace)
        with self._lifecycle:
            self._stopping = True
            stops = list(reversed(self._stops))
        self._not_built("the plugin is shutting down")  # calls waiting for start-up return now

        def stop_components() -> None:
            # Slices stay: the kubelet wipes a driver's slices 30 s after it is gone for good,
            # while a restart (upgrade, crash) re-adopts them with zero writes.
            for name, stop in stops:
                try:
                    stop()
                except Exception as err:
                    log.warning("stopping a component failed", component_name=name, error=str(err))

        stopper = threading.Thread(target=stop_components, name="stop-components", daemon=True)
        stopper.start()
        self.server.stop(grace)
        stopper.join(max(0.0, deadline - time.monotonic()))
        if probes is not None:
            probes.stop()
        log.info("stopped; sockets and lock removed")
        if self._fatal:
            self._report_fatal(self._fatal)
        return code

    def _report_fatal(self, message: str) -> None:
        """The one line that says why serve stops (a JSON record in --log-format json)."""
        if self.config.log_format == "json":
            logs.configure("json", self.config.verbosity)
            log.error("dradriver serve failed", error=message)
        else:
            print(f"dradriver serve: error: {message}", file=sys.stderr)

    def _fail(self, message: str) -> None:
        self._fatal = self._fatal or message
        self._stop.set()

    def started(self, name: str, stop: Callable[[], None]) -> None:
        """Record a started component; if shutdown has begun meanwhile, stop it at once and end
        start-up (the shutdown did not see it)."""
        with self._lifecycle:
            if not self._stopping:
                self._stops.append((name, stop))
                return
        stop()
        raise _StartupInterruptedError

    def readiness_problem(self) -> str | None:
        """Ready once the kubelet has accepted our registration, the driver is built and, with a
        cluster, our ResourceSlices have been published."""
        status = self.registration.status
        if status.registered is None:
            return "not registered with the kubelet yet"
        if not status.registered:
            return f"the kubelet rejected the registration: {status.error}"
        if not self._parts.done():
            return "discovering devices and loading the driver"
        if self._parts.exception() is not None:
            return "the driver failed to initialize"
        publisher = self._parts.result().publisher
        if publisher is not None and not publisher.status.published:
            error = publisher.status.last_error
            return "ResourceSlices not published yet" + (f": {error}" if error else "")
        return None

    def _start_probes(self) -> ProbeServer | None:
        if not self.config.metrics_address:
            return None
        probes = ProbeServer(
            self.config.metrics_address,
            liveness=self.server.liveness_problem,
            readiness=self.readiness_problem,
            metrics=_metrics_exposition,
        )
        probes.start()
        log.info("serving probes", address=self.config.metrics_address, port=probes.port)
        return probes

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signal.Signals(signum).name
        self._stop.set()

    def _initialize(self, register: bool) -> None:
        try:
            # Lazy: with -X importtime the parts' modules (pydantic models, the Kubernetes client,
            # discovery) take 0.35-0.45 s to import, which the sockets-first start-up does not wait for.
            from dradriver.wiring import build_parts, start_parts

            parts = build_parts(self)
            start_parts(parts, self)
            self._parts.set_result(parts)
            if register:
                self.server.register()
                log.info("registering now that the driver is ready (another instance served meanwhile)")
        except _StartupInterruptedError:
            return
        except Exception as err:
            if not isinstance(err, OSError | ValueError | StorageError):
                log.exception("initialization failed")
            self._not_built(str(err))
            self._fail(str(err))

    def _not_built(self, reason: str) -> None:
        """Calls waiting for the parts, and later ones, fail with `reason` (unless they are built)."""
        with contextlib.suppress(InvalidStateError):
            self._parts.set_exception(CallError(f"driver failed to initialize: {reason}"))


def _metrics_exposition() -> bytes:
    # Lazy: prometheus_client is 40 ms of imports (-X importtime), needed only once scraped.
    from dradriver import metrics

    return metrics.exposition()


class _StartupInterruptedError(Exception):
    """Shutdown began while start-up was still starting things."""


def _hard_exit_after(deadline: float, code: int, cleanup: Callable[[], None]) -> None:
    """Exit the process at `deadline` (monotonic) even if threads are stuck: threads blocked on
    I/O cannot be interrupted, and the interpreter would wait for them forever at exit."""

    def watchdog() -> None:
        time.sleep(max(0.0, deadline - time.monotonic()))
        try:
            cleanup()
            log.warning("shutdown grace period over: exiting with calls still running")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    threading.Thread(target=watchdog, name="hard-exit", daemon=True).start()
