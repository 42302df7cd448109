"""The publishing tests' API servers (the loopback fake always, a real one when configured), and
the C fake NVML built once per session."""

from tests.backend.nvml.conftest import fake_nvml_library
from tests.publish.conftest import backend

__all__ = ["backend", "fake_nvml_library"]
