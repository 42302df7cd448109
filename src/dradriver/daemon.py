"""`dradriver serve`: assembles the node daemon around the plugin server and runs it until a signal.

The sockets come up first, with only grpc and the generated code loaded; everything heavier
(discovery, the Kubernetes client, pydantic models) is built afterwards in the background while
the kubelet can already register us. Calls that arrive before that finishes wait for it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from dradriver import __version__, logs
from dradriver.health.board import HealthBoard
from dradriver.plugin.dra import DRAService
from dradriver.plugin.driver import CallError, ClaimRef, Driver, PrepareResult
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.server import PluginPaths, PluginServer, StartupError

if TYPE_CHECKING:
    from dradriver.devicemodel import DeviceSet
    from dradriver.discovery import DeviceLibrary
    from dradriver.health.config import HealthConfig
    from dradriver.health.monitor import HealthMonitor
    from dradriver.kube import KubeClient
    from dradriver.kube.events import NodeEventSender
    from dradriver.prepare.claims import ClaimSource, ClaimWatch
    from dradriver.prepare.driver import GpuDriver
    from dradriver.prepare.stale import StaleClaimCollector
    from dradriver.probes import ProbeServer
    from dradriver.publish import SliceController

#: How long a prepare/unprepare that arrives during start-up waits for the driver to be built.
INIT_WAIT_SECONDS = 30.0

log = logs.get_logger(component="daemon")


@dataclass(frozen=True)
class ServeConfig:
    driver_name: str
    node_name: str
    registry_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    state_dir: Path
    kubeconfig: str | None
    fake_gpus: str | None
    log_format: logs.LogFormat
    verbosity: int
    shutdown_grace: float
    metrics_address: str | None
    claims_dir: Path | None
    driver_root: Path
    driver_root_mount: Path
    partitionable: bool
    stale_claim_grace: float
    #: None: the defaults (`--health-config` not given).
    health: HealthConfig | None = None
    #: Keep this node's allocated claims from a watch, so prepare need not wait for each GET.
    claim_watch: bool = True


class DeferredDriver:
    """Takes calls as soon as the sockets are up and hands them to the real driver once it exists."""

    def __init__(self, wait_seconds: float = INIT_WAIT_SECONDS) -> None:
        self._ready = threading.Event()
        self._driver: Driver | None = None
        self._failure = ""
        self._wait = wait_seconds

    def set(self, driver: Driver) -> None:
        self._driver = driver
        self._ready.set()

    def fail(self, reason: str) -> None:
        self._failure = reason
        self._ready.set()

    @property
    def initialized(self) -> bool:
        return self._driver is not None

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        return self._get().prepare(claims)

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return self._get().unprepare(claims)

    def _get(self) -> Driver:
        if not self._ready.wait(self._wait):
            raise CallError(f"driver is still initializing after {self._wait:.0f}s; retry later")
        if self._driver is None:
            raise CallError(f"driver failed to initialize: {self._failure}")
        return self._driver


class Daemon:
    """The running node daemon; `run` blocks until SIGTERM/SIGINT or a fatal error."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.board = HealthBoard()
        self.registration = RegistrationState()
        self.driver = DeferredDriver()
        self.paths = PluginPaths.for_driver(config.driver_name, config.plugins_dir, config.registry_dir)
        self.service = DRAService(self.driver)
        self.server = PluginServer(
            self.paths, config.driver_name, self.service, self.board, self.registration
        )
        self._stop = threading.Event()
        self._fatal = ""
        self._signal: str | None = None
        self._publisher: SliceController | None = None
        self._collector: StaleClaimCollector | None = None
        self._claim_watch: ClaimWatch | None = None
        self._taints: Callable[[], dict[str, dict[str, Any]]] = dict
        self._health: HealthMonitor | None = None
        self._node_events: NodeEventSender | None = None

    def run(self) -> int:
        # Before anything binds: a SIGTERM during start-up must still clean up.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self.server.start()
        except StartupError as err:
            print(f"dradriver serve: error: {err}", file=sys.stderr)
            return 1
        logs.configure(self.config.log_format, self.config.verbosity)
        log.info(
            "plugin sockets are up",
            version=__version__,
            driver=self.config.driver_name,
            node=self.config.node_name,
            dra_socket=str(self.paths.dra_socket),
            registration_socket=str(self.paths.registration_socket),
        )
        probes = self._start_probes()
        threading.Thread(target=self._initialize, name="initialize", daemon=True).start()
        while not self._stop.wait(1.0):
            pass
        log.info("shutting down", signal=self._signal, grace_seconds=self.config.shutdown_grace)
        if self._collector is not None:
            self._collector.stop()
        if self._claim_watch is not None:
            self._claim_watch.stop()
        if self._publisher is not None:
            # Slices stay: the kubelet wipes a driver's slices 30 s after it is gone for good,
            # while a restart (upgrade, crash) re-adopts them with zero writes.
            self._publisher.stop()
        if self._health is not None:
            self._health.stop()
        if self._node_events is not None:
            self._node_events.close()
        self.server.stop(self.config.shutdown_grace)
        if probes is not None:
            probes.stop()
        log.info("stopped; sockets and lock removed")
        if self._fatal:
            print(f"dradriver serve: error: {self._fatal}", file=sys.stderr)
            return 1
        return 0

    def readiness_problem(self) -> str | None:
        """Ready once the kubelet has accepted our registration, the driver is built and, with a
        cluster, our ResourceSlices have been published."""
        status = self.registration.status
        if status.registered is None:
            return "not registered with the kubelet yet"
        if not status.registered:
            return f"the kubelet rejected the registration: {status.error}"
        if not self.driver.initialized:
            return "discovering devices and loading the driver"
        if self._publisher is not None and not self._publisher.status.published:
            error = self._publisher.status.last_error
            return "ResourceSlices not published yet" + (f": {error}" if error else "")
        return None

    def _start_probes(self) -> ProbeServer | None:
        if not self.config.metrics_address:
            return None
        from dradriver.probes import ProbeServer

        probes = ProbeServer(
            self.config.metrics_address,
            liveness=self.server.liveness_problem,
            readiness=self.readiness_problem,
            metrics=_metrics_exposition,
        )
        probes.start()
        log.info("serving probes", address=self.config.metrics_address, port=probes.port)
        return probes

    def _connect(self) -> KubeClient | None:
        """The API server client, or None in node-only mode (no in-cluster config, no kubeconfig)."""
        from dradriver.kube import load_client

        client = load_client(self.config.kubeconfig)
        if client is None:
            log.warning(
                "no Kubernetes API access: node-only mode, ResourceSlices are not published and claims "
                "cannot be fetched from the API server (run in a pod, or pass --kubeconfig)"
            )
            return None
        from dradriver.kube import KubeError, UnsupportedServerError

        try:
            client.check_resource_v1()
        except UnsupportedServerError:
            raise  # wrong Kubernetes version: no point in running
        except KubeError as err:
            # Unreachable right now: publishing retries with backoff, prepare calls fail until then.
            log.warning("the API server cannot be reached yet; retrying in the background", error=str(err))
            return client
        log.info("connected to the API server", host=client.host)
        return client

    def _claim_source(self, client: KubeClient | None) -> ClaimSource:
        from dradriver.prepare.claims import ApiClaimSource, DirectoryClaimSource, NoClaimSource

        if self.config.claims_dir is not None:
            return DirectoryClaimSource(self.config.claims_dir)
        return ApiClaimSource(client) if client is not None else NoClaimSource()

    def _publish(self, client: KubeClient, desired: Callable[[], list[dict[str, Any]]]) -> None:
        from dradriver.publish import SliceController

        self._publisher = SliceController(
            client, driver_name=self.config.driver_name, node_name=self.config.node_name, desired=desired
        )
        self._publisher.start()

    def _install_metrics(self, driver: GpuDriver, device_types: dict[str, str]) -> None:
        from dradriver import metrics

        def devices() -> list[tuple[str, str]]:
            return [
                (device_types.get(d.device_name, "unknown"), d.health.name.lower())
                for d in self.board.snapshot()[1]
            ]

        self.service.recorder = metrics.CallMetrics()
        metrics.REGISTRY.register(
            metrics.StateCollector(
                devices=devices,
                prepared_claims=lambda: len(driver.records()),
                registered=lambda: self.registration.status.registered is True,
                slice_writes=self._slice_writes,
            )
        )

    def _slice_writes(self) -> dict[str, int]:
        if self._publisher is None:
            return {}
        writes = self._publisher.status.writes
        return {"create": writes.creates, "update": writes.updates, "delete": writes.deletes}

    def _start_health(
        self, library: DeviceLibrary, devices: DeviceSet, client: KubeClient | None
    ) -> Callable[[], dict[str, dict[str, Any]]]:
        """Start watching the devices' health; returns what gives the taints to publish."""
        from dradriver.health import effects
        from dradriver.health.config import HealthConfig
        from dradriver.health.events import HealthMetrics, NoMetrics, SourceOptions
        from dradriver.health.monitor import HealthMonitor, HealthSink
        from dradriver.health.targets import HealthTargets

        config = self.config.health or HealthConfig()
        if not config.enabled:
            log.warning("health monitoring is disabled (enabled: false in the health config)")
            return dict
        metrics: HealthMetrics = NoMetrics()
        if self.config.metrics_address:
            from dradriver.metrics import HealthCounters

            metrics = HealthCounters()
        targets = HealthTargets(devices.devices)
        source = library.health_source(
            targets, SourceOptions(self.config.state_dir, config.thresholds, metrics)
        )
        taints = effects.TaintSink(
            self.config.driver_name,
            config.taint_effect,
            on_change=lambda: self._publisher.resync() if self._publisher is not None else None,
        )
        sinks: list[HealthSink] = [
            effects.BoardSink(self.board, self.config.node_name),
            effects.HealthFileSink(self.config.state_dir, self.board, source.name),
        ]
        if client is not None:
            from dradriver.kube.events import NodeEventSender

            self._node_events = NodeEventSender(
                client, node_name=self.config.node_name, component=self.config.driver_name
            )
            sinks += [
                taints,
                effects.NodeEventSink(self._node_events, self.config.driver_name, config.taint_effect),
            ]
        self._health = HealthMonitor(
            source=source, targets=targets, config=config, sinks=sinks, metrics=metrics
        )
        self._health.start()
        return taints.taints

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signal.Signals(signum).name
        self._stop.set()

    def _initialize(self) -> None:
        try:
            self.driver.set(self._build_driver())
        except Exception as err:
            log.exception("initialization failed")
            self._fatal = str(err)
            self.driver.fail(str(err))
            self._stop.set()

    def _build_driver(self) -> Driver:
        """Discovery, the device model and the GPU driver, built once the sockets are up."""
        from dradriver.devicemodel import build_devices
        from dradriver.discovery import open_library
        from dradriver.health.taints import with_taints
        from dradriver.slices import render_slices

        config = self.config
        library = open_library(config.fake_gpus, driver_root=config.driver_root_mount)
        try:
            inventory = library.discover()
        finally:
            library.close()
        for skipped in inventory.skipped:
            log.warning("GPU skipped", index=skipped.index, reason=skipped.reason)
        devices = build_devices(inventory, driver_name=config.driver_name, partitionable=config.partitionable)
        for warning in devices.warnings:
            log.warning("device model", detail=warning)
        self.board.set_devices([(config.node_name, d.name) for d in devices.devices])
        client = self._connect()

        def desired() -> list[dict[str, Any]]:
            return render_slices(
                with_taints(devices, self._taints()),
                node_name=config.node_name,
                driver_name=config.driver_name,
            )

        # Every device starts healthy, so publishing need not wait for the health monitor: the
        # taints are read at each sync, and a change of health triggers a resync.
        if client is not None:
            self._publish(client, desired)
            if config.claim_watch and config.claims_dir is None:
                from dradriver.prepare.claims import ClaimWatch

                self._claim_watch = ClaimWatch(
                    client, driver_name=config.driver_name, pool_name=config.node_name
                )
                self._claim_watch.start()
        self._taints = self._start_health(library, devices, client)
        # Only now the claim-preparation modules (pydantic models): publishing is already under way.
        from dradriver.prepare.cdi import CdiDirectory
        from dradriver.prepare.checkpoint import CheckpointStore, read_boot_id
        from dradriver.prepare.driver import GpuDriver
        from dradriver.prepare.edits import common_edits
        from dradriver.prepare.hostdriver import driver_mounts
        from dradriver.prepare.sharing import FakeSharing, NvidiaSharing, SharingControl

        sharing: SharingControl = (
            FakeSharing(config.state_dir)
            if config.fake_gpus
            else NvidiaSharing(config.driver_root_mount / "usr/bin", config.state_dir)
        )
        driver = GpuDriver(
            driver_name=config.driver_name,
            pool_name=config.node_name,
            devices={d.name: d.hardware for d in devices.devices},
            claims=self._claim_source(client),
            cdi_dir=CdiDirectory(config.cdi_dir, config.driver_name),
            store=CheckpointStore(config.state_dir),
            common_edits=common_edits(
                inventory.nvidia_uvm_major,
                driver_mounts(config.driver_root_mount, config.driver_root, inventory.driver_version),
            ),
            caps_major=inventory.nvidia_caps_major,
            sharing=sharing,
            boot_id=read_boot_id(),
            hints=self._claim_watch,
        )
        recovery = driver.recover()
        if driver.claims.authoritative:
            from dradriver.prepare.stale import StaleClaimCollector

            self._collector = StaleClaimCollector(driver, driver.claims, grace=config.stale_claim_grace)
            self._collector.start()
        if config.metrics_address:
            self._install_metrics(
                driver, {d.name: str(d.json["attributes"]["type"]["string"]) for d in devices.devices}
            )
        log.info(
            "driver ready",
            devices=len(devices.devices),
            prepared_claims=len(driver.records()),
            rolled_back=recovery.rolled_back,
            orphans_removed=recovery.orphans_removed,
            rebuilt_from_cdi=recovery.rebuilt_from_cdi,
            cleared_after_reboot=recovery.cleared_after_reboot,
        )
        return driver


def _metrics_exposition() -> bytes:
    from dradriver import metrics

    return metrics.exposition()
