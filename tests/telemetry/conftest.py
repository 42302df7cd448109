"""The telemetry tests run serve against an API server (the publishing tests' `backend`) and
read the C fake NVML (the discovery tests' `fake_node`)."""

from pathlib import Path

import pytest

from tests.discovery.conftest import fake_node, pristine_pynvml
from tests.fakenvml.harness import IN_PROCESS_SONAME, build_library, compiler
from tests.publish.conftest import backend

__all__ = ["backend", "fake_node", "in_process_nvml_library", "pristine_pynvml"]


@pytest.fixture(scope="session")
def in_process_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C fake NVML with its telemetry calls, loaded into the test process."""
    if compiler() is None:
        pytest.skip("the C fake NVML needs a C compiler (cc)")
    return build_library(tmp_path_factory.mktemp("fakenvml-telemetry"), IN_PROCESS_SONAME, telemetry=True)
