"""The C fake NVML fixtures of the discovery tests, for MIG reconfiguration through NVML."""

from tests.backend.nvml.conftest import (  # noqa: F401 - fixtures, found by name
    fake_node,
    fake_nvml_library,
    in_process_nvml_library,
    pristine_pynvml,
)
from tests.publish.conftest import fake_api  # noqa: F401 - fixture, found by name
