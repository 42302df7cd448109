"""The node is built without a thread started, then started in one place: a whole node-only node
on fake GPUs (metrics, telemetry, health, a profile file followed) built here and driven by hand."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from dradriver import logs
from dradriver.health.board import HealthBoard
from dradriver.plugin.dra import DRAService
from dradriver.plugin.registration import RegistrationState
from dradriver.plugin.server import PluginPaths, PluginServer
from dradriver.serve_config import ServeConfig
from dradriver.wiring import build_parts
from tests.helpers import DRIVER, write_gpu_profile


@dataclass
class BuildOnly:
    """The daemon's side, as `build_parts` sees it; nothing may be started."""

    config: ServeConfig
    paths: PluginPaths
    server: PluginServer
    board: HealthBoard = field(default_factory=HealthBoard)
    registration: RegistrationState = field(default_factory=RegistrationState)
    started_ns: int = 0

    def started(self, name: str, stop: Callable[[], None]) -> None:
        raise AssertionError(f"{name} was started while the node was being built")


def node_only(root: Path, profile: Path) -> BuildOnly:
    config = ServeConfig(
        driver_name=DRIVER,
        node_name="node-1",
        registry_dir=root / "registry",
        plugins_dir=root / "plugins",
        cdi_dir=root / "cdi",
        state_dir=root / "state",
        kubeconfig=None,
        fake_gpus=str(profile),
        log_format="console",
        verbosity=0,
        shutdown_grace=1.0,
        metrics_address="127.0.0.1:0",
        claims_dir=root / "claims",
        driver_root=Path("/"),
        driver_root_mount=Path("/"),
        partitionable=False,
        stale_claim_grace=300.0,
        telemetry_interval=10.0,
    )
    paths = PluginPaths.for_driver(DRIVER, config.plugins_dir, config.registry_dir)
    board = HealthBoard()
    registration = RegistrationState()
    server = PluginServer(paths, DRIVER, DRAService(Future()), board, registration)
    return BuildOnly(config, paths, server, board, registration)


def test_the_whole_node_is_built_without_a_thread_and_follows_its_devices(tmp_path: Path) -> None:
    logs.configure("console", 0)
    profile = write_gpu_profile(tmp_path / "profile.yaml", 4)
    (tmp_path / "claims").mkdir()
    host = node_only(tmp_path, profile)
    before = set(threading.enumerate())
    parts = build_parts(host)
    assert set(threading.enumerate()) - before == set()
    assert parts.publisher is None  # node-only
    assert parts.health is not None
    assert parts.telemetry is not None
    assert parts.state_metrics is not None
    assert parts.rescan_trigger is not None  # the profile file is followed
    assert sorted(parts.devices.for_prepare().devices) == [f"gpu-{i}" for i in range(4)]
    assert parts.driver.records() == []
    # One scan by hand, as the inventory's thread would make it: the devices every part reads change.
    write_gpu_profile(profile, 2)
    assert parts.inventory.check()
    assert sorted(parts.devices.for_prepare().devices) == ["gpu-0", "gpu-1"]
    assert [d.name for d in parts.devices.published().devices.devices] == ["gpu-0", "gpu-1"]
    assert set(threading.enumerate()) - before == set()
