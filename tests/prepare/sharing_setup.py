"""What the sharing tests of both layers use: claims' devices and their sharing settings."""

from __future__ import annotations

from typing import Any

from dradriver.prepare.config import parse

UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]


class Device:
    def __init__(self, name: str, uuid: str) -> None:
        self.name = name
        self.uuid = uuid


def sharing(strategy: dict[str, Any]) -> Any:
    config = parse({"apiVersion": "gpu.dradriver.dev/v1alpha1", "kind": "GpuConfig", "sharing": strategy})
    return config.sharing
