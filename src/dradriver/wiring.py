"""The node daemon's parts, built in one place once its sockets are up (see `daemon`).

`build_parts` discovers the node, connects to the API server, starts publishing, watching
health, the GPU driver (with its recovery), the stale-claim collector, metrics, telemetry and
the live inventory, in that order, and returns them as one `Parts`. Each part is handed what it
needs when it is made. Where two parts call each other (the publisher reads the health taints,
a taint change resyncs the publisher; the inventory retargets health, an NVML event kicks the
inventory) the callback is a closure over a local of `build_parts` made before anything that can
call it is started.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dradriver import logs, metrics
from dradriver.backend.interface import GpuBackend
from dradriver.devicemodel import DeviceSet, PublishedDevice
from dradriver.discovery import NodeInventory
from dradriver.files.write import ensure_directory
from dradriver.health import effects
from dradriver.health.board import HealthBoard
from dradriver.health.config import HealthConfig
from dradriver.health.events import HealthMetrics, NoMetrics, SourceOptions
from dradriver.health.monitor import HealthMonitor, HealthSink
from dradriver.health.policy import DEVICE_GONE, Problem
from dradriver.health.taints import with_taints
from dradriver.health.targets import HealthTargets
from dradriver.inventory import InventoryWatcher, LiveDevices, ProfileFileTrigger
from dradriver.kube import KubeClient, KubeError, UnsupportedServerError, load_client
from dradriver.kube.events import NodeEventSender
from dradriver.nodescan import NodeScan, scan_node
from dradriver.plugin.dra import DRAService
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.rolling import supports_rolling_update, too_old_message
from dradriver.plugin.server import PluginPaths, PluginServer, instance_alive
from dradriver.prepare.cdi import CdiDirectory, ContainerEdits
from dradriver.prepare.checkpoint import CheckpointError, CheckpointStore, read_boot_id
from dradriver.prepare.claims import (
    ApiClaimSource,
    ClaimSource,
    DirectoryClaimSource,
    NoClaimSource,
    ReservationsTap,
)
from dradriver.prepare.devnodes import HostDeviceNodes
from dradriver.prepare.driver import GpuDriver
from dradriver.prepare.edits import common_edits
from dradriver.prepare.hostdriver import driver_mounts
from dradriver.prepare.mig import MigManager, MigMetrics, NoMigMetrics
from dradriver.prepare.mps_shares import share_daemons
from dradriver.prepare.shared import SerializeLock
from dradriver.prepare.shares import shares_by_enforcement
from dradriver.prepare.stale import StaleClaimCollector
from dradriver.publish import SliceController
from dradriver.publish.admission import check_slice_admission
from dradriver.publish.handover import Marker
from dradriver.serve_config import ServeConfig
from dradriver.slices import render_node_slices
from dradriver.telemetry import service as telemetry
from dradriver.telemetry.idle import IdlePolicy

log = logs.get_logger(component="daemon")


class Host(Protocol):
    """What the daemon made before its parts (the daemon itself): the sockets' side, and where
    started parts go."""

    config: ServeConfig
    board: HealthBoard
    registration: RegistrationState
    service: DRAService
    server: PluginServer
    paths: PluginPaths
    #: Orders this instance among the node's instances (slice handover): they share a clock.
    started_ns: int

    def started(self, name: str, stop: Callable[[], None]) -> None:
        """Record a started part with the daemon, which stops the parts in reverse order."""


class CurrentDevices:
    """What is published now: the live inventory replaces it, the publisher, metrics and
    telemetry read it (one reference, swapped whole)."""

    def __init__(self, first: LiveDevices) -> None:
        self._value = first

    def get(self) -> LiveDevices:
        return self._value

    def set(self, value: LiveDevices) -> None:
        self._value = value


@dataclass(frozen=True)
class Parts:
    """Everything start-up built; a part is None only where the configuration has none."""

    driver: GpuDriver
    devices: CurrentDevices
    inventory: InventoryWatcher
    #: None in node-only mode (no API server).
    publisher: SliceController | None
    #: None with health monitoring disabled.
    health: HealthMonitor | None


def build_parts(host: Host) -> Parts:
    """Discovery, the device model, the API server's side, health and the GPU driver."""
    config = host.config
    for flag, directory in (("--cdi-dir", config.cdi_dir), ("--state-dir", config.state_dir)):
        try:
            ensure_directory(directory)
        except OSError as err:
            raise OSError(f"{flag} {directory}: cannot create: {err.strerror or err}") from None
    scan = _scan(config, _created_gpu_instances(config.state_dir), component="daemon")
    devices = CurrentDevices(LiveDevices(scan.devices, {}))
    host.board.set_devices([(config.node_name, d.name) for d in scan.devices.devices])
    client = _connect(config.kubeconfig)
    node_events = None
    if client is not None:
        node_events = NodeEventSender(client, node_name=config.node_name, component=config.driver_name)
        host.started("node-events", node_events.close)
        check_slice_admission(
            client,
            driver_name=config.driver_name,
            node_name=config.node_name,
            events=node_events,
            required=config.require_admission_policy,
        )
        if config.pod_uid:
            _check_kubelet(host, client, node_events)

    taint_effect = (config.health or HealthConfig()).taint_effect

    def resync() -> None:
        if publisher is not None:
            publisher.resync()

    taints = effects.TaintSink(config.driver_name, taint_effect, on_change=resync)

    def desired() -> list[dict[str, Any]]:
        return render_node_slices(
            with_taints(devices.get().devices, taints.taints()),
            node_name=config.node_name,
            driver_name=config.driver_name,
        )

    # Every device starts healthy, so publishing need not wait for the health monitor: the
    # taints are read at each sync, and a change of health triggers a resync.
    publisher = _publish(host, client, desired) if client is not None else None

    latest: list[NodeInventory] = []

    def rescan() -> DeviceSet:
        # With no MIG device half-made, so that one we made is never taken for an operator's.
        with driver.mig_settled():
            now = _scan(config, frozenset(driver.created_instances()), component=None)
        latest[:] = [now.inventory]
        return now.devices

    def held() -> Set[str]:
        return driver.held_devices()

    def apply(published: LiveDevices) -> None:
        devices.set(published)
        current = published.devices.devices
        host.board.set_devices([(config.node_name, d.name) for d in current])
        if latest:
            driver.set_devices(
                {d.name: d.hardware for d in current if d.name not in published.gone},
                common_edits=_common_edits(config, latest[0]),
                caps_major=latest[0].nvidia_caps_major,
            )
        if health is not None:
            gone = {
                name: Problem(DEVICE_GONE, f"{reason}; kept until its claim is unprepared")
                for name, reason in published.gone.items()
            }
            health.retarget(current, gone)
        resync()

    # Started last, once `driver` and `health` exist; a kick before that only makes its first
    # scan come at once.
    inventory = InventoryWatcher(
        scan=rescan,
        held=held,
        apply=apply,
        published=devices.get(),
        interval=config.rescan_interval,
    )
    targets = HealthTargets(scan.devices.devices)
    health = _start_health(
        host,
        backend=scan.backend,
        targets=targets,
        taints=taints,
        node_events=node_events,
        inventory_changed=inventory.kick,
    )
    driver, reservations = _driver(host, scan, client)
    targets.created = driver.created_instances
    if driver.claims.authoritative:
        collector = StaleClaimCollector(driver, driver.claims, grace=config.stale_claim_grace)
        collector.start()
        host.started("stale-claims", collector.stop)
    if config.metrics_address:
        _install_metrics(host, driver, devices, publisher)
    if reservations is not None:
        _start_telemetry(
            host,
            backend=scan.backend,
            driver=driver,
            reservations=reservations,
            devices=devices,
            node_events=node_events,
        )
    _follow_inventory(host, driver, inventory)
    return Parts(driver, devices, inventory, publisher, health)


def _scan(config: ServeConfig, created: frozenset[tuple[str, int]], component: str | None) -> NodeScan:
    """`component` None: the warnings are not logged again at each rescan."""
    return scan_node(
        config.fake_gpus,
        driver_name=config.driver_name,
        partitionable=config.partitionable,
        driver_root=config.driver_root_mount,
        proc_root=config.proc_root,
        created=created,
        shares=config.shares,
        component=component,
    )


def _created_gpu_instances(state_dir: Path) -> frozenset[tuple[str, int]]:
    """MIG devices an earlier run made for claims, from the checkpoint (recovery settles them).

    An unreadable checkpoint names none: the MIG devices it named then count as an operator's
    and are published and kept as they are, never removed.
    """
    try:
        loaded = CheckpointStore(state_dir).load()
    except (CheckpointError, OSError):
        return frozenset()
    if loaded is None or (loaded.boot_id and loaded.boot_id != read_boot_id()):
        return frozenset()  # MIG devices do not survive a reboot
    return frozenset(loaded.created_gpu_instances())


def _connect(kubeconfig: str | None) -> KubeClient | None:
    """The API server client, or None in node-only mode (no in-cluster config, no kubeconfig)."""
    client = load_client(kubeconfig)
    if client is None:
        log.warning(
            "no Kubernetes API access: node-only mode, ResourceSlices are not published and claims "
            "cannot be fetched from the API server (run in a pod, or pass --kubeconfig)"
        )
        return None
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


def _check_kubelet(host: Host, client: KubeClient, node_events: NodeEventSender) -> None:
    """Rolling updates need a kubelet >= 1.33; an older one is reported and worked around."""
    try:
        node = client.get_node(host.config.node_name)
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
        node_events.send("KubeletTooOldForRollingUpdate", message, "Warning")
        host.server.legacy_kubelet()


def _publish(host: Host, client: KubeClient, desired: Callable[[], list[dict[str, Any]]]) -> SliceController:
    config = host.config
    publisher = SliceController(
        client,
        driver_name=config.driver_name,
        node_name=config.node_name,
        desired=desired,
        marker=Marker(host.started_ns, config.pod_uid),
        instance_alive=lambda instance: instance_alive(config.registry_dir, config.driver_name, instance),
    )
    publisher.start()
    host.started("publisher", publisher.stop)
    return publisher


def _start_health(
    host: Host,
    *,
    backend: GpuBackend,
    targets: HealthTargets,
    taints: effects.TaintSink,
    node_events: NodeEventSender | None,
    inventory_changed: Callable[[], None],
) -> HealthMonitor | None:
    """Start watching the devices' health; None when the health config disables it."""
    serve = host.config
    config = serve.health or HealthConfig()
    if not config.enabled:
        log.warning("health monitoring is disabled (enabled: false in the health config)")
        return None
    counters: HealthMetrics = metrics.HealthCounters() if serve.metrics_address else NoMetrics()
    source = backend.health_source(
        targets,
        SourceOptions(serve.state_dir, config.thresholds, counters, inventory_changed=inventory_changed),
    )
    sinks: list[HealthSink] = [
        effects.BoardSink(host.board, serve.node_name),
        effects.HealthFileSink(serve.state_dir, host.board, source.name),
    ]
    if node_events is not None:
        sinks += [taints, effects.NodeEventSink(node_events, serve.driver_name, config.taint_effect)]
    monitor = HealthMonitor(source=source, targets=targets, config=config, sinks=sinks, metrics=counters)
    monitor.start()
    host.started("health", monitor.stop)
    return monitor


def _claim_source(config: ServeConfig, client: KubeClient | None) -> ClaimSource:
    if config.claims_dir is not None:
        return DirectoryClaimSource(config.claims_dir)
    return ApiClaimSource(client) if client is not None else NoClaimSource()


def _driver(
    host: Host, scan: NodeScan, client: KubeClient | None
) -> tuple[GpuDriver, ReservationsTap | None]:
    """The GPU driver, recovered; with telemetry, the tap that sees what each claim is reserved for."""
    config = host.config
    mig_metrics: MigMetrics = metrics.MigCounters() if config.metrics_address else NoMigMetrics()
    claims = _claim_source(config, client)
    # What each fetched claim is reserved for: the pods the telemetry names beside its devices.
    reservations = None
    if config.metrics_address and config.telemetry_interval:
        claims = reservations = ReservationsTap(claims)
    backend = scan.backend
    driver = GpuDriver(
        driver_name=config.driver_name,
        pool_name=config.node_name,
        devices={d.name: d.hardware for d in scan.devices.devices},
        claims=claims,
        cdi_dir=CdiDirectory(config.cdi_dir, config.driver_name),
        store=CheckpointStore(config.state_dir),
        common_edits=_common_edits(config, scan.inventory),
        caps_major=scan.inventory.nvidia_caps_major,
        sharing=backend.sharing(config.state_dir, config.driver_root_mount),
        boot_id=read_boot_id(),
        mig=MigManager(lambda: backend.mig_control(config.state_dir), mig_metrics),
        serialize=SerializeLock(host.paths.serialize_lock) if config.pod_uid else None,
        host_nodes=None if config.fake_gpus else HostDeviceNodes(config.host_dev, config.proc_root),
        shares=share_daemons(
            config.shares,
            fake=bool(config.fake_gpus),
            driver_root=config.driver_root_mount,
            state_dir=config.state_dir,
        ),
    )
    host.started("driver", driver.close)
    recovery = driver.recover()
    log.info(
        "driver ready",
        devices=len(scan.devices.devices),
        prepared_claims=len(driver.records()),
        rolled_back=recovery.rolled_back,
        rollback_failed=recovery.rollback_failed,
        orphans_removed=recovery.orphans_removed,
        specs_rewritten=recovery.specs_rewritten,
        rebuilt_from_cdi=recovery.rebuilt_from_cdi,
        cleared_after_reboot=recovery.cleared_after_reboot,
        rescan_interval_seconds=config.rescan_interval,
    )
    return driver, reservations


def _common_edits(config: ServeConfig, inventory: NodeInventory) -> ContainerEdits:
    return common_edits(
        inventory.nvidia_uvm_major,
        driver_mounts(config.driver_root_mount, config.driver_root, inventory.driver_version),
    )


def _install_metrics(
    host: Host, driver: GpuDriver, devices: CurrentDevices, publisher: SliceController | None
) -> None:
    def device_health() -> list[tuple[str, str]]:
        current = devices.get().devices
        types = {d.name: str(d.json["attributes"]["type"]["string"]) for d in current.devices}
        return [
            (types.get(d.device_name, "unknown"), d.health.name.lower()) for d in host.board.snapshot()[1]
        ]

    def slice_writes() -> dict[str, int]:
        if publisher is None:
            return {}
        writes = publisher.status.writes
        return {"create": writes.creates, "update": writes.updates, "delete": writes.deletes}

    host.service.recorder = metrics.CallMetrics()
    metrics.REGISTRY.register(
        metrics.StateCollector(
            devices=device_health,
            prepared_claims=lambda: len(driver.records()),
            registered=lambda: host.registration.status.registered is True,
            slice_writes=slice_writes,
            shares=lambda: shares_by_enforcement(driver.records()),
        )
    )


def _start_telemetry(
    host: Host,
    *,
    backend: GpuBackend,
    driver: GpuDriver,
    reservations: ReservationsTap,
    devices: CurrentDevices,
    node_events: NodeEventSender | None,
) -> None:
    """Device telemetry on /metrics; with --idle-threshold, idle claims reported."""
    config = host.config
    idle = None
    if config.idle_threshold is not None and config.idle_window is not None:
        policy = IdlePolicy(config.idle_threshold, config.idle_window)
        idle = telemetry.IdleReporter(policy, node_events)

    def published() -> list[PublishedDevice]:
        return list(devices.get().devices.devices)

    sampler = telemetry.start(
        backend.telemetry(config.state_dir),
        serve=metrics.append_exposition,
        published=published,
        records=driver.records,
        reservations=reservations,
        proc_root=config.proc_root,
        interval=config.telemetry_interval,
        idle=idle,
    )
    host.started("telemetry", sampler.stop)


def _follow_inventory(host: Host, driver: GpuDriver, inventory: InventoryWatcher) -> None:
    """Keep the published devices equal to the node's (see `inventory`)."""
    driver.on_released = inventory.released
    # The profile file's state is taken before the first rescan reads it: a rewrite after that
    # read is then seen by the trigger, one before it by the rescan (either way, none is missed).
    profile = host.config.fake_gpus
    trigger = (
        ProfileFileTrigger(Path(profile), inventory.kick) if profile and Path(profile).is_file() else None
    )
    # A first rescan at once: the node may have changed while the driver was being built.
    inventory.kick()
    inventory.start()
    host.started("inventory", inventory.stop)
    if trigger is not None:
        trigger.start()
        host.started("profile-trigger", trigger.stop)
