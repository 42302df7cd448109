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

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from dradriver import __version__, logs
from dradriver.files.write import StorageError
from dradriver.health.board import HealthBoard
from dradriver.plugin.dra import DRAService
from dradriver.plugin.driver import CallError, ClaimRef, Driver, PrepareResult
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.server import PluginPaths, PluginServer, StartupError
from dradriver.signals import STOP_SIGNALS, pending_stop_signal

if TYPE_CHECKING:
    from dradriver.devicemodel import DeviceSet, PublishedDevice
    from dradriver.devicemodel.shares import SharePolicy
    from dradriver.discovery import DeviceLibrary, NodeInventory
    from dradriver.health.config import HealthConfig
    from dradriver.health.monitor import HealthMonitor
    from dradriver.health.targets import HealthTargets
    from dradriver.inventory import InventoryWatcher, ProfileFileTrigger, Published
    from dradriver.kube import KubeClient
    from dradriver.kube.events import NodeEventSender
    from dradriver.prepare.cdi import ContainerEdits
    from dradriver.prepare.claims import ClaimSource, ReservationsTap
    from dradriver.prepare.driver import GpuDriver
    from dradriver.probes import ProbeServer
    from dradriver.publish import SliceController

#: How long a prepare/unprepare that arrives during start-up waits for the driver to be built.
INIT_WAIT_SECONDS = 30.0
#: After --shutdown-grace, this long for the last clean-up before the process exits regardless.
HARD_EXIT_MARGIN_SECONDS = 0.5

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
    #: Where the host driver's /proc files (/proc/devices, nvidia-caps) are read.
    proc_root: Path = Path("/proc")
    #: Where the host's /dev is seen: the device nodes a spec names are made there if missing.
    host_dev: Path = Path("/dev")
    #: The pod's UID (downward API): rolling updates on, as the Go helper's RollingUpdate(podUID).
    pod_uid: str = ""
    #: Seconds between rescans of the node's devices; 0: only on events.
    rescan_interval: float = 0.0
    #: Seconds between readings of the devices' telemetry (with metrics_address); 0: none.
    telemetry_interval: float = 0.0
    #: Report a claim idle below this SM utilisation (percent) for idle_window seconds; None: off.
    idle_threshold: float | None = None
    idle_window: float | None = None
    #: Which GPUs are published shareable and how shares are enforced (--gpu-shares); None: off.
    shares: SharePolicy | None = None


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
        self.paths = PluginPaths.for_driver(
            config.driver_name, config.plugins_dir, config.registry_dir, config.pod_uid, config.state_dir
        )
        #: Orders this instance among the node's instances (slice handover): they share a clock.
        self.started_ns = time.time_ns()
        self.service = DRAService(self.driver)
        self.server = PluginServer(
            self.paths, config.driver_name, self.service, self.board, self.registration
        )
        self.server.on_lock_lost = self._fail
        self._stop = threading.Event()
        self._fatal = ""
        self._signal: str | None = None
        self._publisher: SliceController | None = None
        self._taints: Callable[[], dict[str, dict[str, Any]]] = dict
        self._health_targets: HealthTargets | None = None
        self._health: HealthMonitor | None = None
        self._node_events: NodeEventSender | None = None
        self._inventory: InventoryWatcher | None = None
        self._profile_trigger: ProfileFileTrigger | None = None
        self._published: Published | None = None
        # What start-up has started, stopped in reverse order; guarded so that a signal at any
        # moment of start-up stops exactly what runs (see `_started`).
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
        self.driver.fail("the plugin is shutting down")  # calls waiting for start-up return now

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

    def _started(self, name: str, stop: Callable[[], None]) -> None:
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
        from dradriver.plugin.server import instance_alive
        from dradriver.publish import SliceController
        from dradriver.publish.handover import Marker

        config = self.config
        publisher = SliceController(
            client,
            driver_name=config.driver_name,
            node_name=config.node_name,
            desired=desired,
            marker=Marker(self.started_ns, config.pod_uid),
            instance_alive=lambda instance: instance_alive(config.registry_dir, config.driver_name, instance),
        )
        publisher.start()
        self._publisher = publisher
        self._started("publisher", publisher.stop)

    def _created_gpu_instances(self) -> frozenset[tuple[str, int]]:
        """MIG devices an earlier run made for claims, from the checkpoint (recovery settles them).

        An unreadable checkpoint names none: the MIG devices it named then count as an operator's
        and are published and kept as they are, never removed.
        """
        from dradriver.prepare.checkpoint import CheckpointError, CheckpointStore, read_boot_id

        try:
            loaded = CheckpointStore(self.config.state_dir).load()
        except (CheckpointError, OSError):
            return frozenset()
        if loaded is None or (loaded.boot_id and loaded.boot_id != read_boot_id()):
            return frozenset()  # MIG devices do not survive a reboot
        return frozenset(loaded.created_gpu_instances())

    def _check_kubelet(self, client: KubeClient) -> None:
        """Rolling updates need a kubelet >= 1.33; an older one is reported and worked around."""
        from dradriver.kube import KubeError
        from dradriver.plugin.rolling import supports_rolling_update, too_old_message

        try:
            node = client.get_node(self.config.node_name)
        except KubeError as err:
            log.warning("cannot read the kubelet's version from the Node", error=str(err))
            return
        version = str(((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""))
        supported = supports_rolling_update(version)
        if supported is None:
            log.warning(
                "the kubelet's version cannot be read; assuming it supports rolling updates", version=version
            )
        elif not supported:
            message = too_old_message(version)
            log.error(message, kubelet_version=version)
            if self._node_events is not None:
                self._node_events.send("KubeletTooOldForRollingUpdate", message, "Warning")
            self.server.legacy_kubelet()

    def _install_metrics(self, driver: GpuDriver) -> None:
        from dradriver import metrics
        from dradriver.prepare.shares import shares_by_enforcement

        def devices() -> list[tuple[str, str]]:
            assert self._published is not None
            current = self._published.devices
            types = {d.name: str(d.json["attributes"]["type"]["string"]) for d in current.devices}
            return [
                (types.get(d.device_name, "unknown"), d.health.name.lower()) for d in self.board.snapshot()[1]
            ]

        self.service.recorder = metrics.CallMetrics()
        metrics.REGISTRY.register(
            metrics.StateCollector(
                devices=devices,
                prepared_claims=lambda: len(driver.records()),
                registered=lambda: self.registration.status.registered is True,
                slice_writes=self._slice_writes,
                shares=lambda: shares_by_enforcement(driver.records()),
            )
        )

    def _start_telemetry(
        self, library: DeviceLibrary, driver: GpuDriver, reservations: ReservationsTap
    ) -> None:
        """Device telemetry on /metrics; with --idle-threshold, idle claims reported."""
        from dradriver import metrics
        from dradriver.telemetry import service
        from dradriver.telemetry.idle import IdlePolicy

        config = self.config
        idle = None
        if config.idle_threshold is not None and config.idle_window is not None:
            policy = IdlePolicy(config.idle_threshold, config.idle_window)
            idle = service.IdleReporter(policy, self._node_events)

        def published() -> list[PublishedDevice]:
            assert self._published is not None
            return list(self._published.devices.devices)

        sampler = service.start(
            library.telemetry(config.state_dir),
            serve=metrics.append_exposition,
            published=published,
            records=driver.records,
            reservations=reservations,
            proc_root=config.proc_root,
            interval=config.telemetry_interval,
            idle=idle,
        )
        self._started("telemetry", sampler.stop)

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
        self._health_targets = targets
        source = library.health_source(
            targets,
            SourceOptions(
                self.config.state_dir,
                config.thresholds,
                metrics,
                inventory_changed=lambda: self._inventory.kick() if self._inventory is not None else None,
            ),
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
        if client is not None and self._node_events is not None:
            sinks += [
                taints,
                effects.NodeEventSink(self._node_events, self.config.driver_name, config.taint_effect),
            ]
        monitor = HealthMonitor(source=source, targets=targets, config=config, sinks=sinks, metrics=metrics)
        monitor.start()
        self._health = monitor
        self._started("health", monitor.stop)
        return taints.taints

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signal.Signals(signum).name
        self._stop.set()

    def _initialize(self, register: bool) -> None:
        try:
            self.driver.set(self._build_driver())
            if register:
                self.server.register()
                log.info("registering now that the driver is ready (another instance served meanwhile)")
        except _StartupInterruptedError:
            return
        except Exception as err:
            if not isinstance(err, OSError | ValueError | StorageError):
                log.exception("initialization failed")
            self.driver.fail(str(err))
            self._fail(str(err))

    def _build_driver(self) -> Driver:
        """Discovery, the device model and the GPU driver, built once the sockets are up."""
        from dradriver.files.write import ensure_directory
        from dradriver.health.taints import with_taints
        from dradriver.inventory import Published
        from dradriver.slices import render_node_slices

        config = self.config
        for flag, directory in (("--cdi-dir", config.cdi_dir), ("--state-dir", config.state_dir)):
            try:
                ensure_directory(directory)
            except OSError as err:
                raise OSError(f"{flag} {directory}: cannot create: {err.strerror or err}") from None
        library, inventory, devices = self._scan(self._created_gpu_instances())
        for skipped in inventory.skipped:
            log.warning("GPU skipped", index=skipped.index, reason=skipped.reason)
        for warning in devices.warnings:
            log.warning("device model", reason=warning)
        self._published = Published(devices, {})
        self.board.set_devices([(config.node_name, d.name) for d in devices.devices])
        client = self._connect()
        if client is not None:
            from dradriver.kube.events import NodeEventSender

            self._node_events = NodeEventSender(
                client, node_name=config.node_name, component=config.driver_name
            )
            self._started("node-events", self._node_events.close)
            if config.pod_uid:
                self._check_kubelet(client)

        def desired() -> list[dict[str, Any]]:
            assert self._published is not None
            return render_node_slices(
                with_taints(self._published.devices, self._taints()),
                node_name=config.node_name,
                driver_name=config.driver_name,
            )

        # Every device starts healthy, so publishing need not wait for the health monitor: the
        # taints are read at each sync, and a change of health triggers a resync.
        if client is not None:
            self._publish(client, desired)
        self._taints = self._start_health(library, devices, client)
        # Only now the claim-preparation modules (pydantic models): publishing is already under way.
        from dradriver.prepare.cdi import CdiDirectory
        from dradriver.prepare.checkpoint import CheckpointStore, read_boot_id
        from dradriver.prepare.claims import ReservationsTap
        from dradriver.prepare.devnodes import HostDeviceNodes
        from dradriver.prepare.driver import GpuDriver
        from dradriver.prepare.mig import MigManager, MigMetrics, NoMigMetrics
        from dradriver.prepare.mps_shares import share_daemons
        from dradriver.prepare.shared import SerializeLock
        from dradriver.prepare.sharing import FakeSharing, NvidiaSharing, SharingControl

        mig_metrics: MigMetrics = NoMigMetrics()
        if config.metrics_address:
            from dradriver.metrics import MigCounters

            mig_metrics = MigCounters()
        sharing: SharingControl = (
            FakeSharing(config.state_dir)
            if config.fake_gpus
            else NvidiaSharing(config.driver_root_mount, config.state_dir)
        )
        claims = self._claim_source(client)
        # What each fetched claim is reserved for: the pods the telemetry names beside its devices.
        reservations = None
        if config.metrics_address and config.telemetry_interval:
            claims = reservations = ReservationsTap(claims)
        driver = GpuDriver(
            driver_name=config.driver_name,
            pool_name=config.node_name,
            devices={d.name: d.hardware for d in devices.devices},
            claims=claims,
            cdi_dir=CdiDirectory(config.cdi_dir, config.driver_name),
            store=CheckpointStore(config.state_dir),
            common_edits=self._common_edits(inventory),
            caps_major=inventory.nvidia_caps_major,
            sharing=sharing,
            boot_id=read_boot_id(),
            mig=MigManager(lambda: library.mig_control(config.state_dir), mig_metrics),
            serialize=SerializeLock(self.paths.serialize_lock) if config.pod_uid else None,
            host_nodes=None if config.fake_gpus else HostDeviceNodes(config.host_dev, config.proc_root),
            shares=share_daemons(
                config.shares,
                fake=bool(config.fake_gpus),
                driver_root=config.driver_root_mount,
                state_dir=config.state_dir,
            ),
        )
        self._started("driver", driver.close)
        recovery = driver.recover()
        if self._health_targets is not None:
            self._health_targets.created = driver.created_instances
        if driver.claims.authoritative:
            from dradriver.prepare.stale import StaleClaimCollector

            collector = StaleClaimCollector(driver, driver.claims, grace=config.stale_claim_grace)
            collector.start()
            self._started("stale-claims", collector.stop)
        if config.metrics_address:
            self._install_metrics(driver)
        if reservations is not None:
            self._start_telemetry(library, driver, reservations)
        self._follow_inventory(driver)
        log.info(
            "driver ready",
            devices=len(devices.devices),
            prepared_claims=len(driver.records()),
            rolled_back=recovery.rolled_back,
            rollback_failed=recovery.rollback_failed,
            orphans_removed=recovery.orphans_removed,
            specs_rewritten=recovery.specs_rewritten,
            rebuilt_from_cdi=recovery.rebuilt_from_cdi,
            cleared_after_reboot=recovery.cleared_after_reboot,
            rescan_interval_seconds=config.rescan_interval,
        )
        return driver

    def _scan(self, created: frozenset[tuple[str, int]]) -> tuple[DeviceLibrary, NodeInventory, DeviceSet]:
        """One look at the node: the (closed) library, its inventory and the device set built from
        it; `created` names the GPU instances dradriver made (published as their placements)."""
        from dradriver.devicemodel import build_devices
        from dradriver.discovery import open_library

        config = self.config
        library = open_library(
            config.fake_gpus, driver_root=config.driver_root_mount, proc_root=config.proc_root
        )
        try:
            inventory = library.discover()
        finally:
            library.close()
        devices = build_devices(
            inventory,
            driver_name=config.driver_name,
            partitionable=config.partitionable,
            created=created if config.partitionable else frozenset(),
            shares=config.shares,
        )
        return library, inventory, devices

    def _common_edits(self, inventory: NodeInventory) -> ContainerEdits:
        from dradriver.prepare.edits import common_edits
        from dradriver.prepare.hostdriver import driver_mounts

        config = self.config
        return common_edits(
            inventory.nvidia_uvm_major,
            driver_mounts(config.driver_root_mount, config.driver_root, inventory.driver_version),
        )

    def _follow_inventory(self, driver: GpuDriver) -> None:
        """Keep the published devices equal to the node's (see `inventory`)."""
        from dradriver.inventory import InventoryWatcher, ProfileFileTrigger

        assert self._published is not None
        latest: list[NodeInventory] = []

        def scan() -> DeviceSet:
            # With no MIG device half-made, so that one we made is never taken for an operator's.
            with driver.mig_settled():
                _, inventory, devices = self._scan(frozenset(driver.created_instances()))
            latest[:] = [inventory]
            return devices

        def apply(published: Published) -> None:
            from dradriver.health.policy import DEVICE_GONE, Problem

            self._published = published
            current = published.devices.devices
            self.board.set_devices([(self.config.node_name, d.name) for d in current])
            if latest:
                driver.set_devices(
                    {d.name: d.hardware for d in current if d.name not in published.gone},
                    common_edits=self._common_edits(latest[0]),
                    caps_major=latest[0].nvidia_caps_major,
                )
            if self._health is not None:
                gone = {
                    name: Problem(DEVICE_GONE, f"{reason}; kept until its claim is unprepared")
                    for name, reason in published.gone.items()
                }
                self._health.retarget(current, gone)
            if self._publisher is not None:
                self._publisher.resync()

        inventory = InventoryWatcher(
            scan=scan,
            held=driver.held_devices,
            apply=apply,
            published=self._published,
            interval=self.config.rescan_interval,
        )
        driver.on_released = inventory.released
        self._inventory = inventory
        # A first rescan at once: the node may have changed while the driver was being built.
        inventory.kick()
        inventory.start()
        self._started("inventory", inventory.stop)
        profile = self.config.fake_gpus
        if profile is not None and Path(profile).is_file():
            trigger = ProfileFileTrigger(Path(profile), inventory.kick)
            trigger.start()
            self._profile_trigger = trigger
            self._started("profile-trigger", trigger.stop)


def _metrics_exposition() -> bytes:
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
