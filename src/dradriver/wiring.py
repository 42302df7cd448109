"""The node daemon's parts: built in one place once its sockets are up, then started in one place.

`build_parts` makes every part, each handed what it needs when it is made, and starts nothing (a
test builds the whole node without a thread). `start_parts` starts them in order: Events, the
publisher, health, the driver (its recovery first), the stale-claim collector, metrics, telemetry
and the live inventory. Where two parts need each other, what one reads of the other is made
first and handed to both: the health taints (`Taints`) before the publisher that renders them and
the sink that republishes on a change; the inventory's kick (an Event) before the health source
that sets it; the ledger and the MIG manager before the inventory that asks them what is held and
the driver that changes it; the node's devices (`CurrentDevices`) before everything that reads
them and the inventory that replaces them.

The types that each hold "the node's devices", and why each is its own:
- `NodeInventory` (discovery): the hardware as a scan found it, with the host driver's facts;
- `DeviceSet` (devicemodel): the devices a scan publishes, with their attributes;
- `NodeScan` (nodescan): one scan's `NodeInventory` and `DeviceSet`, and the backend that made it;
- `LiveDevices` (inventory): the published `DeviceSet` plus the vanished devices a claim still holds;
- `NodeDevices` (prepare): what prepare works on, the hardware by name with every spec's edits;
- `HealthTargets` (health): the published devices indexed by the hardware an event names;
- `CurrentDevices` (here): the live `LiveDevices` and `NodeDevices`, swapped together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from dradriver import logs, metrics
from dradriver.backend.interface import GpuBackend, Startable
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
from dradriver.inventory import InventoryWatcher, LiveDevices
from dradriver.kube import KubeClient, KubeError, UnsupportedServerError, load_client
from dradriver.kube.events import NodeEventSender
from dradriver.nodescan import NodeScan, scan_node
from dradriver.plugin.dra import NO_RECORDER, CallRecorder
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.rolling import supports_rolling_update, too_old_message
from dradriver.plugin.server import PluginPaths, PluginServer, instance_alive
from dradriver.prepare.cdi import CdiDirectory
from dradriver.prepare.checkpoint import CheckpointStore, read_boot_id
from dradriver.prepare.claims import (
    ApiClaimSource,
    ClaimSource,
    DirectoryClaimSource,
    NoClaimSource,
    ReservationsTap,
)
from dradriver.prepare.edits import common_edits
from dradriver.prepare.gpu_driver import GpuDriver
from dradriver.prepare.gpu_shares import shares_by_enforcement
from dradriver.prepare.hostdriver import driver_mounts
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.metadata_files import MetadataFiles
from dradriver.prepare.mig import MigManager, MigMetrics, NoMigMetrics
from dradriver.prepare.preparer import NodeDevices
from dradriver.prepare.serialize import SerializeLock
from dradriver.prepare.stale import StaleClaimCollector
from dradriver.publish import SliceController
from dradriver.publish.admission import check_slice_admission
from dradriver.publish.handover import Marker
from dradriver.serve_config import ServeConfig
from dradriver.slices import render_node_slices
from dradriver.telemetry import service as telemetry
from dradriver.telemetry.idle import IdlePolicy
from dradriver.telemetry.sampler import TelemetrySampler

log = logs.get_logger(component="daemon")


class Host(Protocol):
    """What the daemon made before its parts (the daemon itself): the sockets' side, and where
    started parts go."""

    config: ServeConfig
    board: HealthBoard
    registration: RegistrationState
    server: PluginServer
    paths: PluginPaths
    #: Orders this instance among the node's instances (slice handover): they share a clock.
    started_ns: int

    def started(self, name: str, stop: Callable[[], None]) -> None:
        """Record a started part with the daemon, which stops the parts in reverse order."""


class CurrentDevices:
    """The node's devices now: what is published (the publisher, metrics and telemetry read it)
    and what claims are prepared on (the driver reads it at each call). The live inventory
    replaces both at once."""

    def __init__(self, published: LiveDevices, prepare: NodeDevices) -> None:
        self._now = (published, prepare)

    def published(self) -> LiveDevices:
        return self._now[0]

    def for_prepare(self) -> NodeDevices:
        return self._now[1]

    def set(self, published: LiveDevices, prepare: NodeDevices) -> None:
        self._now = (published, prepare)


@dataclass(frozen=True)
class Parts:
    """Everything start-up built; a part is None only where the configuration has none."""

    driver: GpuDriver
    devices: CurrentDevices
    inventory: InventoryWatcher
    #: How DRA calls are recorded (metrics), or not.
    recorder: CallRecorder
    #: None in node-only mode (no API server).
    client: KubeClient | None
    node_events: NodeEventSender | None
    publisher: SliceController | None
    #: None with health monitoring disabled.
    health: HealthMonitor | None
    collector: StaleClaimCollector | None
    #: None without --metrics-address.
    state_metrics: metrics.StateCollector | None
    telemetry: TelemetrySampler | None
    #: What kicks a rescan beside NVML's events (a fake profile file), if anything.
    rescan_trigger: Startable | None


def build_parts(host: Host) -> Parts:
    """Discovery, the device model, the API server's side, health and the GPU driver: made, not
    started."""
    config = host.config
    for flag, directory in (("--cdi-dir", config.cdi_dir), ("--state-dir", config.state_dir)):
        try:
            ensure_directory(directory)
        except OSError as err:
            raise OSError(f"{flag} {directory}: cannot create: {err.strerror or err}") from None
    ledger = Ledger(CheckpointStore(config.state_dir), read_boot_id())
    scan = _scan(config, frozenset(ledger.created_on_disk()), component="daemon")
    backend = scan.backend
    devices = CurrentDevices(
        LiveDevices(scan.devices, {}), _for_prepare(config, scan.devices.devices, scan.inventory)
    )
    host.board.set_devices([(config.node_name, d.name) for d in scan.devices.devices])
    client = _connect(config.kubeconfig)
    node_events = (
        NodeEventSender(client, node_name=config.node_name, component=config.driver_name)
        if client is not None
        else None
    )
    health_config = config.health or HealthConfig()
    taints = effects.Taints(config.driver_name, health_config.taint_effect)
    publisher = _publisher(host, client, devices, taints) if client is not None else None
    mig_metrics: MigMetrics = metrics.MigCounters() if config.metrics_address else NoMigMetrics()
    mig = MigManager(lambda: backend.mig_control(config.state_dir), mig_metrics)
    rescan = threading.Event()  # set: the inventory scans now (NVML's events, a profile file)
    health = _health(
        host,
        backend=backend,
        targets=HealthTargets(scan.devices.devices, created=ledger.created_instances),
        sinks=[effects.TaintSink(taints, on_change=publisher.resync)] if publisher is not None else [],
        node_events=node_events,
        inventory_changed=rescan.set,
    )
    follower = _Follower(
        config, mig=mig, ledger=ledger, board=host.board, devices=devices, health=health, publisher=publisher
    )
    inventory = InventoryWatcher(
        scan=follower.scan,
        held=ledger.held_devices,
        apply=follower.apply,
        published=devices.published(),
        interval=config.rescan_interval,
        kicked=rescan,
    )
    claims = _claim_source(config, client)
    # What each fetched claim is reserved for: the pods the telemetry names beside its devices.
    reservations = None
    if config.metrics_address and config.telemetry_interval:
        claims = reservations = ReservationsTap(claims)
    driver = GpuDriver(
        driver_name=config.driver_name,
        pool_name=config.node_name,
        ledger=ledger,
        node=devices.for_prepare,
        claims=claims,
        cdi_dir=CdiDirectory(config.cdi_dir, config.driver_name),
        sharing=backend.sharing(config.state_dir, config.driver_root_mount),
        mig=mig,
        shares=backend.share_daemons(config.shares, config.state_dir, config.driver_root_mount),
        metadata=MetadataFiles(
            config.device_metadata_dir or config.state_dir / "device-metadata",
            config.driver_name,
            enabled=config.device_metadata,
        ),
        serialize=SerializeLock(host.paths.serialize_lock) if config.pod_uid else None,
        host_nodes=backend.host_nodes(config.host_dev, config.proc_root),
        on_released=inventory.released,
    )
    collector = (
        StaleClaimCollector(driver, claims, grace=config.stale_claim_grace) if claims.authoritative else None
    )
    return Parts(
        driver=driver,
        devices=devices,
        inventory=inventory,
        recorder=metrics.CallMetrics() if config.metrics_address else NO_RECORDER,
        client=client,
        node_events=node_events,
        publisher=publisher,
        health=health,
        collector=collector,
        state_metrics=_state_metrics(host, driver, devices, publisher) if config.metrics_address else None,
        telemetry=(
            _telemetry(
                config,
                backend=backend,
                driver=driver,
                reservations=reservations,
                devices=devices,
                node_events=node_events,
            )
            if reservations is not None
            else None
        ),
        # Its view of the profile file is taken now, before the first rescan reads the file: a
        # rewrite after that read is seen by the trigger, one before it by the rescan.
        rescan_trigger=backend.rescan_trigger(rescan.set),
    )


def start_parts(parts: Parts, host: Host) -> None:
    """Start what `build_parts` made, in order, each recorded with the daemon to be stopped."""
    config = host.config
    if parts.node_events is not None:
        parts.node_events.start()
        host.started("node-events", parts.node_events.close)
    if parts.client is not None and parts.node_events is not None:
        check_slice_admission(
            parts.client,
            driver_name=config.driver_name,
            node_name=config.node_name,
            events=parts.node_events,
            required=config.require_admission_policy,
        )
        if config.pod_uid:
            _check_kubelet(host, parts.client, parts.node_events)
    # Every device starts healthy, so publishing need not wait for the health monitor: the
    # taints are read at each sync, and a change of health triggers a resync.
    if parts.publisher is not None:
        parts.publisher.start()
        host.started("publisher", parts.publisher.stop)
    if parts.health is not None:
        parts.health.start()
        host.started("health", parts.health.stop)
    host.started("driver", parts.driver.close)
    _recover(parts.driver, parts.devices, config)
    if parts.collector is not None:
        parts.collector.start()
        host.started("stale-claims", parts.collector.stop)
    if parts.state_metrics is not None:
        metrics.REGISTRY.register(parts.state_metrics)
    if parts.telemetry is not None:
        metrics.append_exposition(parts.telemetry.exposition)
        parts.telemetry.start()
        host.started("telemetry", parts.telemetry.stop)
    # A first rescan at once: the node may have changed while the driver was being built.
    parts.inventory.kick()
    parts.inventory.start()
    host.started("inventory", parts.inventory.stop)
    if parts.rescan_trigger is not None:
        parts.rescan_trigger.start()
        host.started("profile-trigger", parts.rescan_trigger.stop)


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


def _publisher(
    host: Host, client: KubeClient, devices: CurrentDevices, taints: effects.Taints
) -> SliceController:
    config = host.config

    def desired() -> list[dict[str, Any]]:
        return render_node_slices(
            with_taints(devices.published().devices, taints.taints()),
            node_name=config.node_name,
            driver_name=config.driver_name,
        )

    return SliceController(
        client,
        driver_name=config.driver_name,
        node_name=config.node_name,
        desired=desired,
        marker=Marker(host.started_ns, config.pod_uid),
        instance_alive=lambda instance: instance_alive(config.registry_dir, config.driver_name, instance),
    )


def _health(
    host: Host,
    *,
    backend: GpuBackend,
    targets: HealthTargets,
    sinks: list[HealthSink],
    node_events: NodeEventSender | None,
    inventory_changed: Callable[[], None],
) -> HealthMonitor | None:
    """What watches the devices' health (with `sinks` among its effects); None when the health
    config disables it."""
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
    sinks = [
        effects.BoardSink(host.board, serve.node_name),
        effects.HealthFileSink(serve.state_dir, host.board, source.name),
        *sinks,
    ]
    if node_events is not None:
        sinks.append(effects.NodeEventSink(node_events, serve.driver_name, config.taint_effect))
    return HealthMonitor(source=source, targets=targets, config=config, sinks=sinks, metrics=counters)


class _Follower:
    """What the live inventory scans, and where a change of the node's devices goes: the
    devices' holder, the health board and monitor, the publisher."""

    def __init__(
        self,
        config: ServeConfig,
        *,
        mig: MigManager,
        ledger: Ledger,
        board: HealthBoard,
        devices: CurrentDevices,
        health: HealthMonitor | None,
        publisher: SliceController | None,
    ) -> None:
        self._config = config
        self._mig = mig
        self._ledger = ledger
        self._board = board
        self._devices = devices
        self._health = health
        self._publisher = publisher
        #: What the last scan found (the host driver's facts every spec's edits come from).
        self._latest: NodeInventory | None = None

    def scan(self) -> DeviceSet:
        # With no MIG device half-made, so that one we made is never taken for an operator's.
        with self._mig.settled():
            now = _scan(self._config, frozenset(self._ledger.created_instances()), component=None)
        self._latest = now.inventory
        return now.devices

    def apply(self, published: LiveDevices) -> None:
        current = published.devices.devices
        prepare = self._devices.for_prepare()
        if self._latest is not None:
            usable = [d for d in current if d.name not in published.gone]
            prepare = _for_prepare(self._config, usable, self._latest)
        self._devices.set(published, prepare)
        self._board.set_devices([(self._config.node_name, d.name) for d in current])
        if self._health is not None:
            gone = {
                name: Problem(DEVICE_GONE, f"{reason}; kept until its claim is unprepared")
                for name, reason in published.gone.items()
            }
            self._health.retarget(current, gone)
        if self._publisher is not None:
            self._publisher.resync()


def _claim_source(config: ServeConfig, client: KubeClient | None) -> ClaimSource:
    if config.claims_dir is not None:
        return DirectoryClaimSource(config.claims_dir)
    return ApiClaimSource(client) if client is not None else NoClaimSource()


def _recover(driver: GpuDriver, devices: CurrentDevices, config: ServeConfig) -> None:
    recovery = driver.recover()
    log.info(
        "driver ready",
        devices=len(devices.published().devices.devices),
        prepared_claims=len(driver.records()),
        rolled_back=recovery.rolled_back,
        rollback_failed=recovery.rollback_failed,
        orphans_removed=recovery.orphans_removed,
        specs_rewritten=recovery.specs_rewritten,
        metadata_removed=recovery.metadata_removed,
        metadata_rewritten=recovery.metadata_rewritten,
        rebuilt_from_cdi=recovery.rebuilt_from_cdi,
        cleared_after_reboot=recovery.cleared_after_reboot,
        rescan_interval_seconds=config.rescan_interval,
    )


def _for_prepare(
    config: ServeConfig, devices: Iterable[PublishedDevice], inventory: NodeInventory
) -> NodeDevices:
    """What claims are prepared on: these devices, with the host driver's files every spec mounts."""
    edits = common_edits(
        inventory.nvidia_uvm_major,
        driver_mounts(config.driver_root_mount, config.driver_root, inventory.driver_version),
    )
    return NodeDevices.published(devices, edits, inventory.nvidia_caps_major)


def _state_metrics(
    host: Host, driver: GpuDriver, devices: CurrentDevices, publisher: SliceController | None
) -> metrics.StateCollector:
    def device_health() -> list[tuple[str, str]]:
        current = devices.published().devices
        types = {d.name: str(d.json["attributes"]["type"]["string"]) for d in current.devices}
        return [
            (types.get(d.device_name, "unknown"), d.health.name.lower()) for d in host.board.snapshot()[1]
        ]

    def slice_writes() -> dict[str, int]:
        if publisher is None:
            return {}
        writes = publisher.status.writes
        return {"create": writes.creates, "update": writes.updates, "delete": writes.deletes}

    return metrics.StateCollector(
        devices=device_health,
        prepared_claims=lambda: len(driver.records()),
        registered=lambda: host.registration.status.registered is True,
        slice_writes=slice_writes,
        shares=lambda: shares_by_enforcement(driver.records()),
    )


def _telemetry(
    config: ServeConfig,
    *,
    backend: GpuBackend,
    driver: GpuDriver,
    reservations: ReservationsTap,
    devices: CurrentDevices,
    node_events: NodeEventSender | None,
) -> TelemetrySampler:
    """Device telemetry for /metrics; with --idle-threshold, idle claims reported."""
    idle = None
    if config.idle_threshold is not None and config.idle_window is not None:
        policy = IdlePolicy(config.idle_threshold, config.idle_window)
        idle = telemetry.IdleReporter(policy, node_events)

    def published() -> list[PublishedDevice]:
        return list(devices.published().devices.devices)

    return telemetry.build_sampler(
        backend.telemetry(config.state_dir),
        published=published,
        records=driver.records,
        reservations=reservations,
        proc_root=config.proc_root,
        interval=config.telemetry_interval,
        idle=idle,
        usage=telemetry.UsageStore(config.state_dir / telemetry.USAGE_FILE),
        tenant_labels=config.metrics_tenant_labels,
    )
