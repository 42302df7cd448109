"""Fixtures for the publishing tests: `backend` runs a test against the loopback fake API
server (always) and against the real cluster when there is one (skipped otherwise)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.publish.apiservers import Backend, make_backend
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
