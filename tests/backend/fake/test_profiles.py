"""Fake GPU profiles: the built-in ones, the file format, and its error messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver.backend.fake.backend import FakeBackend
from dradriver.backend.fake.profile import builtin_mig_tables, load_builtin_profile
from dradriver.backend.select import builtin_profile_names, open_backend
from dradriver.discovery import DiscoveryError
from dradriver.discovery.nvidia_caps import (
    DriverNodes,
    driver_layout_minor,
    parse_char_major,
    parse_mig_minors,
    read_driver_nodes,
)


def test_builtin_profiles_include_the_documented_ones() -> None:
    assert {"dgx-h100", "dgx-a100-mig", "t4x4", "mixed"} <= set(builtin_profile_names())


def test_dgx_h100() -> None:
    inventory = open_backend("dgx-h100").discover()
    assert len(inventory.gpus) == 8
    assert {gpu.product_name for gpu in inventory.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {gpu.compute_capability for gpu in inventory.gpus} == {(9, 0)}
    assert [gpu.minor for gpu in inventory.gpus] == list(range(8))
    assert [gpu.index for gpu in inventory.gpus] == list(range(8))
    assert inventory.gpus[0].memory_bytes == 81559 * 2**20
    assert all(gpu.mig_capable and not gpu.mig_enabled for gpu in inventory.gpus)
    assert len({gpu.uuid for gpu in inventory.gpus}) == 8
    assert all(gpu.uuid.startswith("GPU-") for gpu in inventory.gpus)


def test_dgx_a100_mig_has_mig_devices_of_several_profiles() -> None:
    inventory = open_backend("dgx-a100-mig").discover()
    assert {gpu.product_name for gpu in inventory.gpus} == {"NVIDIA A100-SXM4-80GB"}
    enabled = [gpu for gpu in inventory.gpus if gpu.mig_enabled]
    assert 0 < len(enabled) < len(inventory.gpus)
    profiles = {mig.profile for gpu in enabled for mig in gpu.mig_devices}
    assert profiles == {"3g.40gb", "2g.20gb", "1g.10gb"}
    mig = inventory.gpus[0].mig_devices[0]
    assert (mig.parent_minor, mig.parent_uuid) == (0, inventory.gpus[0].uuid)
    assert (mig.gi_caps_minor, mig.ci_caps_minor) == (
        driver_layout_minor(0, mig.gi_id),
        driver_layout_minor(0, mig.gi_id, 0),
    )
    assert inventory.nvidia_caps_major is not None


def test_profiles_are_deterministic() -> None:
    assert open_backend("mixed").discover() == open_backend("mixed").discover()


def test_fake_libraries_do_not_share_state() -> None:
    first = open_backend("t4x4")
    second = open_backend("t4x4")
    assert isinstance(first, FakeBackend)
    assert first is not second
    assert first.discover() == second.discover()


def test_mig_tables_are_consistent() -> None:
    for name, table in builtin_mig_tables().items():
        for profile in table:
            assert len(profile.placement_starts) >= profile.instance_count or profile.name.endswith("+me"), (
                name
            )
            assert max(profile.placement_starts) + profile.placement_size <= 8, (name, profile.name)


def _write(tmp_path: Path, data: Any) -> str:
    path = tmp_path / "node.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def _minimal(**group: Any) -> dict[str, Any]:
    gpu = {"productName": "Test GPU", "architecture": "Ampere", "computeCapability": "8.0", "memoryMiB": 1024}
    return {"driverVersion": "550.54.15", "cudaDriverVersion": "12.4", "gpus": [{**gpu, **group}]}


def test_custom_profile_file(tmp_path: Path) -> None:
    data = _minimal(count=2, firstMinor=4, numaNodes=[0, 1], uuids=["GPU-a", "GPU-b"])
    inventory = open_backend(_write(tmp_path, data)).discover()
    assert [(g.minor, g.uuid, g.numa_node) for g in inventory.gpus] == [(4, "GPU-a", 0), (5, "GPU-b", 1)]
    assert [g.pci_bus_id for g in inventory.gpus] == ["0000:05:00.0", "0000:06:00.0"]


def test_inline_mig_profile_table(tmp_path: Path) -> None:
    table = [
        {"name": "1g.6gb", "id": 19, "sliceCount": 1, "instanceCount": 4, "memoryMiB": 5888,
         "multiprocessors": 14, "placementSize": 1, "placementStarts": [0, 1, 2, 3]},
    ]  # fmt: skip
    data = _minimal(mig={"profiles": table, "enabled": True, "devices": [{"profile": "1g.6gb", "start": 3}]})
    gpu = open_backend(_write(tmp_path, data)).discover().gpus[0]
    assert [(m.profile, m.placement.start, m.gi_id) for m in gpu.mig_devices] == [("1g.6gb", 3, 1)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_minimal(memoryMiB="lots"), r"gpus\[0\]\.memoryMiB: Input should be a valid integer"),
        (_minimal(memoryMiB=0), r"gpus\[0\]\.memoryMiB: Input should be greater than 0"),
        (_minimal(computeCapability=9.0), r"gpus\[0\]\.computeCapability: Input should be a valid string"),
        (_minimal(computeCapability="9"), r"gpus\[0\]\.computeCapability: must be MAJOR\.MINOR"),
        (_minimal(colour="green"), r"gpus\[0\]\.colour: Extra inputs are not permitted"),
        (_minimal(count=2, uuids=["GPU-a"]), r"gpus\[0\]\.uuids: has 1 items, expected count=2"),
        (_minimal(pciBusIds=["0:1:2"]), r"gpus\[0\]\.pciBusIds: .* is not a lowercase PCI address"),
        (_minimal(mig={"table": "h200"}), r"gpus\[0\]\.mig\.table: unknown MIG profile table 'h200'"),
        (_minimal(mig={"enabled": True}), r"gpus\[0\]\.mig: exactly one of table .* or profiles"),
        (
            _minimal(mig={"table": "a100-sxm4-80gb", "devices": [{"profile": "1g.10gb", "start": 0}]}),
            r"gpus\[0\]\.mig: MIG devices are listed but MIG is not enabled",
        ),
        (
            _minimal(
                mig={
                    "table": "a100-sxm4-80gb",
                    "enabled": True,
                    "devices": [{"profile": "9g.1tb", "start": 0}],
                }
            ),
            r"gpus\[0\]\.mig\.devices\[0\]\.profile: '9g\.1tb' is not in the MIG profile table",
        ),
        (
            _minimal(
                mig={
                    "table": "a100-sxm4-80gb",
                    "enabled": True,
                    "devices": [{"profile": "3g.40gb", "start": 2}],
                }
            ),
            r"gpus\[0\]\.mig\.devices\[0\]\.start: 2 is not a placement of 3g\.40gb \(allowed: 0, 4\)",
        ),
        (
            _minimal(
                mig={
                    "table": "a100-sxm4-80gb",
                    "enabled": True,
                    "devices": [{"profile": "3g.40gb", "start": 0}, {"profile": "1g.10gb", "start": 1}],
                }
            ),
            r"gpus\[0\]\.mig\.devices\[1\]: memory slice 1 is already used by devices\[0\]",
        ),
        (
            {**_minimal(), "gpus": [_minimal()["gpus"][0], _minimal()["gpus"][0] | {"firstMinor": 0}]},
            r"profile: GPU minor 0 is used by two GPU groups",
        ),
        ({"gpus": []}, r"driverVersion: Field required"),
        ("gpus: [", r"invalid YAML"),
        ("- just\n- a list\n", r"must be a mapping with a 'gpus' list"),
    ],
)
def test_invalid_profile_names_the_file_and_field(tmp_path: Path, data: Any, message: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(DiscoveryError, match=message) as caught:
        open_backend(path)
    text = str(caught.value)
    assert text.startswith(f"invalid fake GPU profile {path}: ")
    assert "\n" not in text


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match=r"fake GPU profile .*nope\.yaml: cannot read: No such file"):
        open_backend(str(tmp_path / "nope.yaml"))


def test_unknown_profile_name_lists_the_builtin_ones() -> None:
    with pytest.raises(DiscoveryError, match=r"unknown fake GPU profile 'dgx-z9'.*dgx-a100-mig, dgx-h100"):
        open_backend("dgx-z9")


def test_builtin_profiles_validate() -> None:
    for name in builtin_profile_names():
        assert load_builtin_profile(name).gpus


def test_mig_caps_tables(tmp_path: Path) -> None:
    devices = (
        "Character devices:\n195 nvidia\n237 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n259 nvidia-caps\n"
    )
    assert parse_char_major(devices, "nvidia-caps") == 237
    assert parse_char_major(devices, "nvidia-uvm") == 510
    assert parse_char_major("Block devices:\n237 nvidia-caps\n", "nvidia-caps") is None
    assert parse_mig_minors(
        "config 1\nmonitor 2\ngpu0/gi1/access 12\nbroken line here\ngpu0/gi1/ci0/access 13\n"
    ) == {
        "config": 1,
        "monitor": 2,
        "gpu0/gi1/access": 12,
        "gpu0/gi1/ci0/access": 13,
    }
    # The driver's layout, as /proc/driver/nvidia-caps/mig-minors shows it on a real node.
    assert driver_layout_minor(0, 0) == 3
    assert driver_layout_minor(0, 0, 7) == 11
    assert driver_layout_minor(0, 1) == 12
    assert driver_layout_minor(1, 0) == 138
    nodes = read_driver_nodes(tmp_path)  # nothing there: no MIG caps, no UVM, no error
    assert nodes == DriverNodes()
    (tmp_path / "devices").write_text(devices)
    assert read_driver_nodes(tmp_path) == DriverNodes(caps_major=237, uvm_major=510)
