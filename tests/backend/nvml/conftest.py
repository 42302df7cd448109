"""Fixtures for discovery tests: the C fake NVML, built once per session with the system compiler."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from dradriver.backend.nvml.backend import NvmlBackend
from dradriver.discovery import NodeInventory
from tests.fakenvml.harness import (
    CONFIG_ENV,
    IN_PROCESS_SONAME,
    SONAME,
    Failure,
    build_library,
    compiler,
    config_text,
    write_proc,
    write_sys,
)


def _build(tmp_path_factory: pytest.TempPathFactory, soname: str) -> Path:
    if compiler() is None:
        pytest.skip("the C fake NVML needs a C compiler (cc)")
    return build_library(tmp_path_factory.mktemp("fakenvml"), soname)


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """libnvidia-ml.so.1 for subprocesses, found by the dynamic loader through LD_LIBRARY_PATH."""
    return _build(tmp_path_factory, SONAME)


@pytest.fixture(scope="session")
def in_process_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, IN_PROCESS_SONAME)


@pytest.fixture
def pristine_pynvml() -> Iterator[None]:
    """Give later tests pynvml as it was: no library loaded, no cached function pointers."""
    import pynvml

    yield
    with pynvml.libLoadLock:
        pynvml.nvmlLib = None
        pynvml._nvmlGetFunctionPointer_cache.clear()


@dataclass(frozen=True)
class FakeNode:
    """A node the fake NVML serves: its config file and the /proc and /sys trees next to it."""

    library: Path
    config: Path
    proc_root: Path
    sys_root: Path

    def open(self) -> NvmlBackend:
        return NvmlBackend(library_path=str(self.library), proc_root=self.proc_root, sys_root=self.sys_root)

    def discover(self) -> NodeInventory:
        library = self.open()
        try:
            return library.discover()
        finally:
            library.close()


FakeNodeFactory = Callable[..., FakeNode]


@pytest.fixture
def fake_node(
    in_process_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pristine_pynvml: None
) -> FakeNodeFactory:
    """fake_node(inventory, failures=()) -> a FakeNode that NVML will report as `inventory`."""

    def make(
        inventory: NodeInventory, failures: Sequence[Failure] = (), config: str | None = None
    ) -> FakeNode:
        node = FakeNode(in_process_nvml_library, tmp_path / "nvml.conf", tmp_path / "proc", tmp_path / "sys")
        node.config.write_text(config if config is not None else config_text(inventory, failures))
        write_proc(inventory, node.proc_root)
        write_sys(inventory, node.sys_root)
        monkeypatch.setenv(CONFIG_ENV, str(node.config))
        return node

    return make
