"""dradriver: a Kubernetes Dynamic Resource Allocation (DRA) kubelet plugin for NVIDIA GPUs."""

__version__ = "0.1.0"

#: The driver name used when none is configured. A domain of our own, so that it never collides
#: with another driver's ResourceSlices, CEL attribute domain or CDI vendor.
DEFAULT_DRIVER_NAME = "gpu.dradriver.dev"
