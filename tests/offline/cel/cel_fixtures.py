"""Test data shared by the CEL tests: a realistic dradriver GPU device."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.dradriver.dev"


def gpu_device(name: str = "gpu-0", **overrides: Any) -> dict[str, Any]:
    """A resource.k8s.io/v1 Device as dradriver publishes it (issue 3 attribute set)."""
    device: dict[str, Any] = {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": "GPU-8c7e3d1a-0000-1111-2222-333344445555"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "computeMajor": {"int": 9},
            "computeMinor": {"int": 0},
            "driverVersion": {"version": "550.54.15"},
            "cudaDriverVersion": {"version": "12.4.0"},
            "minor": {"int": 0},
            "migCapable": {"bool": True},
            "migEnabled": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
            "numaNode": {"int": 0},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    device.update(overrides)
    return device
