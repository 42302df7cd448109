"""The telemetry tests run serve against an API server (the publishing tests' `backend`) and
read the C fake NVML (the discovery tests' `fake_node`)."""

from tests.discovery.conftest import fake_node, in_process_nvml_library, pristine_pynvml
from tests.publish.conftest import backend

__all__ = ["backend", "fake_node", "in_process_nvml_library", "pristine_pynvml"]
