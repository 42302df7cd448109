"""The real NVML code path (pynvml over ctypes) against the C fake libnvidia-ml.so.1."""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest
import yaml

from dradriver.backend.nvml.discovery import NvmlLibrary, normalize_bus_id
from dradriver.backend.select import builtin_profile_names, open_backend
from dradriver.devicemodel import build_devices, mig_device_name
from dradriver.discovery import DiscoveryError, MigPlacement
from dradriver.discovery.nvidia_caps import driver_layout_minor
from tests.fakenvml.harness import (
    CONFIG_ENV,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_UNKNOWN,
    Failure,
    config_text,
)

from .conftest import FakeNodeFactory

DRIVER = "gpu.dradriver.dev"


@pytest.mark.parametrize("profile", builtin_profile_names())
def test_nvml_discovers_what_the_equivalent_fake_profile_reports(
    profile: str, fake_node: FakeNodeFactory
) -> None:
    expected = open_backend(profile).discover()
    assert fake_node(expected).discover() == expected


def test_addressing_mode_and_module_id_where_nvml_reports_them(
    fake_node: FakeNodeFactory, tmp_path: Path
) -> None:
    """A coherent platform (GH200-like: ATS) with module ids; a GPU without them publishes neither."""
    profile = {
        "driverVersion": "580.65.06",
        "cudaDriverVersion": "13.0",
        "gpus": [
            {"productName": "NVIDIA GH200 480GB", "count": 2, "architecture": "Hopper",
             "computeCapability": "9.0", "memoryMiB": 97871, "addressingMode": "ATS", "moduleIds": [1, 2]},
            {"productName": "Tesla T4", "architecture": "Turing", "computeCapability": "7.5",
             "memoryMiB": 15360},
        ],
    }  # fmt: skip
    path = tmp_path / "gh200.yaml"
    path.write_text(yaml.safe_dump(profile))
    expected = open_backend(str(path)).discover()
    got = fake_node(expected).discover()
    assert got == expected
    assert [(g.addressing_mode, g.module_id) for g in got.gpus] == [("ATS", 1), ("ATS", 2), (None, None)]
    attributes = [d.json["attributes"] for d in build_devices(got, driver_name=DRIVER).devices]
    assert [a.get("addressingMode") for a in attributes] == [{"string": "ATS"}] * 2 + [None]
    assert [a.get("gpuModuleID") for a in attributes] == [{"int": 1}, {"int": 2}, None]


def test_numa_comes_from_sysfs_when_nvml_does_not_report_it(fake_node: FakeNodeFactory) -> None:
    expected = open_backend("dgx-h100").discover()
    node = fake_node(expected)
    node.config.write_text(config_text(expected, numa_from_nvml=False))
    got = node.discover()
    assert [gpu.numa_node for gpu in got.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [gpu.pcie_root for gpu in got.gpus] == [gpu.pcie_root for gpu in expected.gpus]


def test_error_on_one_gpu_skips_it_and_reports_why(fake_node: FakeNodeFactory) -> None:
    expected = open_backend("dgx-h100").discover()
    node = fake_node(expected, [Failure("nvmlDeviceGetUUID", NVML_ERROR_UNKNOWN, gpu=2)])
    got = node.discover()
    assert [gpu.minor for gpu in got.gpus] == [0, 1, 3, 4, 5, 6, 7]
    assert len(got.skipped) == 1
    assert got.skipped[0].index == 2
    assert "nvmlDeviceGetUUID" in got.skipped[0].reason
    assert "Unknown Error" in got.skipped[0].reason
    # The other GPUs keep their names: gpu-<minor> does not shift when a sibling is missing.
    names = [d.name for d in build_devices(got, driver_name=DRIVER).devices]
    assert names == ["gpu-0", "gpu-1", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]


def test_host_driver_unloaded_mid_scan_fails_the_scan_rather_than_skip_live_gpus(
    fake_node: FakeNodeFactory,
) -> None:
    """The host driver unloaded after the count was read (a driver upgrade racing a rescan): the
    GPUs after that point are not gone, so the scan fails (the rescan keeps what is published)."""
    expected = open_backend("dgx-h100").discover()
    unloaded = Failure("nvmlDeviceGetHandleByIndex_v2", NVML_ERROR_DRIVER_NOT_LOADED, gpu=6)
    node = fake_node(expected, [unloaded])
    with pytest.raises(DiscoveryError, match=r"host driver went away during the scan: .*Driver Not Loaded"):
        node.discover()


def test_lost_gpu_is_skipped(fake_node: FakeNodeFactory) -> None:
    expected = open_backend("t4x4").discover()
    got = fake_node(
        expected, [Failure("nvmlDeviceGetHandleByIndex_v2", NVML_ERROR_GPU_IS_LOST, gpu=0)]
    ).discover()
    assert [gpu.minor for gpu in got.gpus] == [1, 2, 3]
    assert "GPU is lost" in got.skipped[0].reason


def test_error_on_mig_devices_skips_only_those(fake_node: FakeNodeFactory) -> None:
    expected = open_backend("dgx-a100-mig").discover()
    got = fake_node(expected, [Failure("nvmlDeviceGetAttributes_v2", NVML_ERROR_UNKNOWN, gpu=1)]).discover()
    assert len(got.gpus) == 8
    assert got.gpus[1].mig_devices == ()
    assert got.gpus[0].mig_devices == expected.gpus[0].mig_devices
    assert [s.index for s in got.skipped] == [1, 1, 1]
    assert all(
        s.reason.startswith("MIG device ") and "nvmlDeviceGetAttributes" in s.reason for s in got.skipped
    )


def test_unsupported_optional_queries_do_not_lose_the_gpu(fake_node: FakeNodeFactory) -> None:
    expected = open_backend("t4x4").discover()
    not_supported = 3
    failures = [
        Failure("nvmlDeviceGetArchitecture", not_supported),
        Failure("nvmlDeviceGetMemoryInfo_v2", not_supported),
    ]
    got = fake_node(expected, failures).discover()
    assert got.skipped == ()
    assert [gpu.architecture for gpu in got.gpus] == ["Unknown"] * 4
    assert [gpu.memory_bytes for gpu in got.gpus] == [gpu.memory_bytes for gpu in expected.gpus]  # v1 struct


def test_driver_not_loaded_is_a_clear_startup_error(fake_node: FakeNodeFactory) -> None:
    node = fake_node(
        open_backend("t4x4").discover(), [Failure("nvmlInitWithFlags", NVML_ERROR_DRIVER_NOT_LOADED)]
    )
    with pytest.raises(DiscoveryError, match="NVIDIA kernel driver is not loaded"):
        node.open()


def test_failing_gpu_listing_is_a_discovery_error(fake_node: FakeNodeFactory) -> None:
    node = fake_node(open_backend("t4x4").discover(), [Failure("nvmlDeviceGetCount_v2", NVML_ERROR_UNKNOWN)])
    library = node.open()
    try:
        with pytest.raises(DiscoveryError, match="NVML cannot list the node's GPUs: nvmlDeviceGetCount"):
            library.discover()
    finally:
        library.close()


def test_missing_library_file_is_a_clear_error(tmp_path: Path, pristine_pynvml: None) -> None:
    with pytest.raises(DiscoveryError, match=r"cannot load NVML library .*no-such-lib"):
        NvmlLibrary(library_path=str(tmp_path / "no-such-lib.so.1"))


def test_mig_compute_instance_smaller_than_its_gpu_instance(fake_node: FakeNodeFactory) -> None:
    """Two 1c.3g.40gb compute instances share one GPU instance: distinct names, caps minors per CI."""
    base = open_backend("dgx-a100-mig").discover()
    gpu = replace(base.gpus[0], mig_devices=())
    three_g = next(p for p in gpu.mig_profiles if p.name == "3g.40gb")
    resources = replace(three_g.resources, multiprocessors=14, copy_engines=1)
    devices = tuple(
        replace(
            base.gpus[0].mig_devices[0],
            uuid=f"MIG-00000000-0000-4000-8000-00000000000{ci}",
            ci_id=ci,
            profile="1c.3g.40gb",
            compute_placement=MigPlacement(ci, 1),
            full_gpu_instance=False,
            resources=resources,
            ci_caps_minor=driver_layout_minor(0, 1, ci),
        )
        for ci in (0, 1)
    )
    inventory = replace(base, gpus=(replace(gpu, mig_devices=devices),))
    got = fake_node(inventory).discover()
    assert got.skipped == ()
    assert got.gpus[0].mig_devices == devices
    assert [d.ci_caps_minor for d in devices] == [13, 14]
    names = [d.name for d in build_devices(got, driver_name=DRIVER).devices]
    assert names == [mig_device_name(0, "1c.3g.40gb", 0, 0), mig_device_name(0, "1c.3g.40gb", 0, 1)]
    assert names == ["gpu-0-mig-1c3g40gb-0-c0", "gpu-0-mig-1c3g40gb-0-c1"]


def test_bus_id_normalisation() -> None:
    assert normalize_bus_id("00000000:1B:00.0") == "0000:1b:00.0"
    assert normalize_bus_id("0000:c3:1f.7") == "0000:c3:1f.7"


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DRADRIVER_")}
    return subprocess.run(
        [sys.executable, "-m", "dradriver", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_over_ld_library_path_publishes_what_the_fake_profile_publishes(
    fake_nvml_library: Path, tmp_path: Path
) -> None:
    """The whole product path in a fresh process: libnvidia-ml found by the dynamic loader."""
    # /proc and /sys are this machine's here, so the profile leaves PCIe roots and NUMA unknown.
    profile = yaml.safe_load(
        resources.files("dradriver.backend.fake.profiles").joinpath("dgx-a100-mig.yaml").read_text()
    )
    for group in profile["gpus"]:
        group.pop("pcieRoots", None)
        group.pop("numaNodes", None)
    profile_file = tmp_path / "dgx-a100-mig.yaml"
    profile_file.write_text(yaml.safe_dump(profile))
    config = tmp_path / "nvml.conf"
    config.write_text(config_text(open_backend(str(profile_file)).discover()))

    common = ("slices", "--node-name", "node-a", "-o", "json")
    from_nvml = _cli(*common, env={"LD_LIBRARY_PATH": str(fake_nvml_library.parent), CONFIG_ENV: str(config)})
    from_fake = _cli(*common, "--fake-gpus", str(profile_file), env={})
    assert from_nvml.returncode == 0, from_nvml.stderr
    assert from_fake.returncode == 0, from_fake.stderr
    assert json.loads(from_nvml.stdout) == json.loads(from_fake.stdout)
    assert len(json.loads(from_nvml.stdout)[0]["spec"]["devices"]) == 28


def test_cli_without_nvml_fails_with_one_clear_line(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml") is not None:
        pytest.skip("a real libnvidia-ml is installed on this machine")
    result = _cli("discover", env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "NVML library libnvidia-ml.so.1 not found" in lines[0]
    assert "--fake-gpus" in lines[0]


def test_cli_loads_nvml_from_the_driver_root(fake_nvml_library: Path, tmp_path: Path) -> None:
    """As in a container: no NVML on the loader path, the host driver's under --driver-root-mount,
    reached through an absolute symlink that must resolve inside the root, not on this machine."""
    root = tmp_path / "driver-root"
    lib64 = root / "usr/lib64"
    lib64.mkdir(parents=True)
    shutil.copy(fake_nvml_library, lib64 / "libnvidia-ml.so.570.124.06")
    (lib64 / "libnvidia-ml.so.1").symlink_to("/usr/lib64/libnvidia-ml.so.570.124.06")
    config = tmp_path / "nvml.conf"
    config.write_text(config_text(open_backend("t4x4").discover()))
    env = {CONFIG_ENV: str(config), "LD_LIBRARY_PATH": str(tmp_path / "empty")}

    found = _cli(
        "discover",
        "-o",
        "json",
        "--driver-root",
        "/run/nvidia/driver",
        "--driver-root-mount",
        str(root),
        env=env,
    )
    assert found.returncode == 0, found.stderr
    assert [d["name"] for d in json.loads(found.stdout)["devices"]] == [f"gpu-{i}" for i in range(4)]

    missing = _cli("discover", "--driver-root", str(tmp_path / "elsewhere"), env=env)
    if ctypes.util.find_library("nvidia-ml") is None:
        assert missing.returncode == 2
        assert f"not found under the driver root {tmp_path / 'elsewhere'}" in missing.stderr
        assert len(missing.stderr.strip().splitlines()) == 1
