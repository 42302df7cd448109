"""The one error discovery raises: a node whose GPUs cannot be discovered at all."""


class DiscoveryError(Exception):
    """No NVML/driver, an unknown fake profile or an invalid profile file; the message is one line."""
