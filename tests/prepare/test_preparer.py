"""The preparer's pipeline, on the fake GPUs and real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.discovery import Gpu, MigDevice
from dradriver.prepare import cdi, edits, preparer
from tests.helpers import allocated_claim, uid
from tests.prepare.node import Node


def test_each_devices_cdi_entry_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = Node(tmp_path, "a100-mig-empty", partitionable=True)  # GPU 0 in MIG mode, GPU 1 not
    built: list[str] = []

    def counted(name: str, hardware: Gpu | MigDevice, caps_major: int | None) -> cdi.ContainerEdits:
        built.append(name)
        return edits.device_edits(name, hardware, caps_major)

    monkeypatch.setattr(preparer, "device_edits", counted)
    claim = allocated_claim(
        "claim-1",
        uid(1),
        [{"request": "gpu", "device": "gpu-1"}, {"request": "mig", "device": "gpu-0-mig-3g40gb-0"}],
    )
    driver = node.driver()
    try:
        ref = node.add(claim)
        assert driver.prepare([ref])[ref.uid].error == ""
    finally:
        driver.close()
    # The whole GPU's when planned, the MIG device's once it was made.
    assert built == ["gpu-1", "gpu-0-mig-3g40gb-0"]
    devices = node.spec(ref)["devices"]
    assert isinstance(devices, list)
    assert [d["name"] for d in devices] == [f"{ref.uid}-gpu-1", f"{ref.uid}-gpu-0-mig-3g40gb-0"]
