"""Fixtures for the publishing tests: `backend` runs a test against the loopback fake API
server (always) and against the real cluster when there is one (skipped otherwise)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dradriver.kube import KubeClient
from dradriver.publish import SliceController
from tests.publish.apiservers import TEST_DRIVER, Backend, make_backend
from tests.publish.kubefake import FakeApiServer


@pytest.fixture(params=["fake", pytest.param("cluster", marks=pytest.mark.cluster)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend(request, tmp_path)
    yield b
    b.cleanup()


@pytest.fixture(params=["fake", pytest.param("cluster", marks=pytest.mark.cluster)])
def gates_off_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """An API server with DRADeviceTaints and DRAPartitionableDevices off."""
    b = make_backend(request, tmp_path, gates_off=True)
    yield b
    b.cleanup()


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[FakeApiServer]:
    fake = FakeApiServer().start()
    fake.write_kubeconfig(tmp_path / "kubeconfig")
    yield fake
    fake.stop()


@pytest.fixture
def controllers() -> Iterator[list[SliceController]]:
    started: list[SliceController] = []
    yield started
    for controller in started:
        controller.stop()


@pytest.fixture
def start(controllers: list[SliceController]) -> Callable[..., SliceController]:
    """Start a SliceController for the test's node; stopped when the test ends."""

    def start(
        client: KubeClient, node: str, desired: Callable[[], list[dict[str, Any]]], **kw: Any
    ) -> SliceController:
        controller = SliceController(client, driver_name=TEST_DRIVER, node_name=node, desired=desired, **kw)
        controllers.append(controller)
        controller.start()
        return controller

    return start
