"""The NVML backend: the node's real GPUs, through NVIDIA's `nvidia-ml-py` binding (module `pynvml`).

A failing NVML call on one GPU (or one MIG device) skips that device and is reported in the
inventory; only a node where NVML cannot start at all is an error. Besides NVML it reads the
nvidia-caps tables under /proc and the PCIe topology under /sys (both roots configurable).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from dradriver.discovery import (
    DiscoveryError,
    Gpu,
    MigDevice,
    MigPlacement,
    MigProfile,
    MigResources,
    NodeInventory,
    SkippedDevice,
)
from dradriver.discovery.driverroot import LIBRARY_DIRS, NVML_LIBRARY
from dradriver.discovery.nvidia_caps import DriverNodes, read_driver_nodes

#: NVML_BRAND_* -> the name we publish: NVIDIA's DRA driver's names (go-nvlib GetBrandAsString).
BRAND_NAMES = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}

#: NVML_DEVICE_ARCH_* -> architecture name, as NVIDIA's DRA driver publishes it (go-nvlib).
ARCHITECTURE_NAMES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

#: NVML_DEVICE_ADDRESSING_MODE_* -> the name NVIDIA's DRA driver publishes.
ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}

_MIG_ENABLED = 1
_MIG_NAME_PREFIX = "MIG "
#: MigResources's fields and how NVML names them: in a GPU instance profile's info, and in a MIG
#: device's attributes (whose engines are shared within its GPU instance).
_RESOURCE_NAMES = (
    ("memory_mib", "memorySizeMB", "memorySizeMB"),
    ("multiprocessors", "multiprocessorCount", "multiprocessorCount"),
    ("copy_engines", "copyEngineCount", "sharedCopyEngineCount"),
    ("decoders", "decoderCount", "sharedDecoderCount"),
    ("encoders", "encoderCount", "sharedEncoderCount"),
    ("jpeg_engines", "jpegCount", "sharedJpegCount"),
    ("ofa_engines", "ofaCount", "sharedOfaCount"),
)
_T = TypeVar("_T")


def unsupported_as_none(nvml: Any, fn: Callable[..., _T], *args: Any) -> _T | None:
    """`fn(*args)`, or None for a call some GPUs or drivers do not support (NOT_SUPPORTED, a
    symbol this driver lacks, an argument this GPU has no such thing for); other NVML errors
    are raised."""
    try:
        return fn(*args)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound, nvml.NVMLError_InvalidArgument):
        return None


def host_driver_gone(nvml: Any, error: Exception) -> bool:
    """Whether an NVML error says the host driver went away (unloaded for an upgrade): every
    handle died with it, whichever call saw it first."""
    return isinstance(error, nvml.NVMLError_DriverNotLoaded | nvml.NVMLError_Uninitialized)


class _CallFailedError(Exception):
    """An NVML call failed for one device; carries which call, for the report."""

    def __init__(self, call: str, error: Exception) -> None:
        super().__init__(f"{call}: {error}")
        self.error = error


@dataclass(frozen=True)
class _Parent:
    """The GPU whose MIG devices are being read."""

    handle: Any
    index: int
    minor: int
    uuid: str


@dataclass(frozen=True)
class _Scan:
    """What one discovery pass shares across GPUs: the caps tables and the skipped-device report."""

    nodes: DriverNodes
    skipped: list[SkippedDevice]


def _resources(struct: Any, *, of_device: bool) -> MigResources:
    """A GPU instance profile's resources from its info, or a MIG device's from its attributes."""
    return MigResources(
        **{
            field: getattr(struct, device if of_device else profile)
            for field, profile, device in _RESOURCE_NAMES
        }
    )


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def normalize_bus_id(bus_id: str) -> str:
    """NVML's "00000000:18:00.0" -> the lowercase extended BDF "0000:18:00.0" Kubernetes expects."""
    domain, bus, rest = bus_id.strip().split(":")
    device, function = rest.split(".")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"


def cuda_version_text(version: int) -> str:
    """NVML's integer CUDA driver version (12080) -> "12.8"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _init_error(nvml: Any, err: Exception, searched_root: Path | None) -> DiscoveryError:
    hint = "use --fake-gpus PROFILE to run without GPUs"
    if isinstance(err, nvml.NVMLError_LibraryNotFound):
        where = (
            f" under the driver root {searched_root} ({', '.join(LIBRARY_DIRS)}) nor on the loader path"
            if searched_root is not None
            else ""
        )
        return DiscoveryError(
            f"NVML library {NVML_LIBRARY} not found{where}: is the NVIDIA driver installed? ({hint})"
        )
    if isinstance(err, nvml.NVMLError_DriverNotLoaded):
        return DiscoveryError(f"the NVIDIA kernel driver is not loaded ({hint})")
    if isinstance(err, nvml.NVMLError_NoPermission):
        return DiscoveryError(
            "no permission to use the NVIDIA driver: run privileged with /dev/nvidia* available"
        )
    return DiscoveryError(f"NVML failed to start: {err} ({hint})")


class NvmlLibrary:
    """Discovery over NVML; NVML is initialised here and shut down by `close()`."""

    def __init__(
        self,
        *,
        library_path: str | None = None,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        searched_root: Path | None = None,
    ) -> None:
        self._nvml: Any = pynvml
        self.library_path = library_path
        self.proc_root = proc_root
        self._sys_root = sys_root
        self._profile_names: dict[str, dict[int, str]] = {}
        self._nodes: DriverNodes | None = None
        if library_path is not None:
            self._use_library(library_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise _init_error(pynvml, err, searched_root) from None
        self._open = True

    def _use_library(self, path: str) -> None:
        """Load libnvidia-ml from `path` for pynvml, whose own search knows only the loader path."""
        try:
            library = ctypes.CDLL(path)
        except OSError as err:
            raise DiscoveryError(f"cannot load NVML library {path}: {err}") from None
        with self._nvml.libLoadLock:
            self._nvml.nvmlLib = library
            # Function pointers are cached per name; they belong to the library loaded before.
            self._nvml._nvmlGetFunctionPointer_cache.clear()

    def close(self) -> None:
        if self._open:
            self._open = False
            # Shutting down a broken NVML must not mask what went wrong before.
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            raise _CallFailedError(fn.__name__, err) from None

    def _optional(self, fn: Callable[..., _T], *args: Any) -> _T | None:
        try:
            return unsupported_as_none(self._nvml, fn, *args)
        except self._nvml.NVMLError as err:
            raise _CallFailedError(fn.__name__, err) from None

    def discover(self) -> NodeInventory:
        nvml = self._nvml
        try:
            driver_version = _text(self._call(nvml.nvmlSystemGetDriverVersion))
            cuda_version = cuda_version_text(self._call(nvml.nvmlSystemGetCudaDriverVersion))
            count = self._call(nvml.nvmlDeviceGetCount)
        except _CallFailedError as err:
            raise DiscoveryError(f"NVML cannot list the node's GPUs: {err}") from None
        scan = _Scan(read_driver_nodes(self.proc_root), [])
        gpus: list[Gpu] = []
        for index in range(count):
            try:
                gpus.append(self._gpu(index, scan))
            except _CallFailedError as err:
                self._skip(scan, SkippedDevice(index, str(err)), err.error)
        return NodeInventory(
            driver_version=driver_version,
            cuda_driver_version=cuda_version,
            gpus=tuple(sorted(gpus, key=lambda gpu: gpu.minor)),
            nvidia_caps_major=scan.nodes.caps_major,
            nvidia_uvm_major=scan.nodes.uvm_major,
            skipped=tuple(scan.skipped),
        )

    def _gpu(self, index: int, scan: _Scan) -> Gpu:
        nvml = self._nvml
        handle = self._call(nvml.nvmlDeviceGetHandleByIndex, index)
        minor = self._call(nvml.nvmlDeviceGetMinorNumber, handle)
        uuid = _text(self._call(nvml.nvmlDeviceGetUUID, handle))
        bus_id = normalize_bus_id(_text(self._call(nvml.nvmlDeviceGetPciInfo, handle).busId))
        arch = self._optional(nvml.nvmlDeviceGetArchitecture, handle)
        numa = self._optional(nvml.nvmlDeviceGetNumaNodeId, handle)
        mig_mode = self._optional(nvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = mig_mode is not None and mig_mode[0] == _MIG_ENABLED
        profiles = self._mig_profiles(handle) if mig_mode is not None else ()
        cc_major, cc_minor = self._call(nvml.nvmlDeviceGetCudaComputeCapability, handle)
        addressing = self._optional(nvml.nvmlDeviceGetAddressingMode, handle)
        module_id = self._optional(nvml.nvmlDeviceGetModuleId, handle)
        return Gpu(
            index=index,
            minor=minor,
            uuid=uuid,
            product_name=_text(self._call(nvml.nvmlDeviceGetName, handle)),
            brand=BRAND_NAMES.get(self._call(nvml.nvmlDeviceGetBrand, handle), "Unknown"),
            architecture=ARCHITECTURE_NAMES.get(arch if arch is not None else -1, "Unknown"),
            compute_capability=(cc_major, cc_minor),
            memory_bytes=self._memory_total(handle),
            pci_bus_id=bus_id,
            pcie_root=self._pcie_root(bus_id),
            numa_node=numa if numa is not None and numa >= 0 else self._sysfs_numa_node(bus_id),
            mig_capable=mig_mode is not None,
            mig_enabled=mig_enabled,
            mig_profiles=profiles,
            mig_devices=self._mig_devices(_Parent(handle, index, minor, uuid), profiles, scan)
            if mig_enabled
            else (),
            addressing_mode=ADDRESSING_MODES.get(addressing) if addressing is not None else None,
            module_id=module_id or None,  # 0: no module id (as NVIDIA's driver reads it)
        )

    def _memory_total(self, handle: Any) -> int:
        nvml = self._nvml
        info = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2)
        if info is None:  # drivers before the v2 struct
            info = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
        return int(info.total)

    def _mig_profiles(self, handle: Any) -> tuple[MigProfile, ...]:
        nvml = self._nvml
        profiles: dict[int, MigProfile] = {}
        for profile_index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._optional(nvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile_index)
            if info is None or info.instanceCount == 0 or info.id in profiles:
                continue
            profiles[info.id] = MigProfile(
                name=_text(info.name).removeprefix(_MIG_NAME_PREFIX),
                profile_id=info.id,
                slice_count=info.sliceCount,
                instance_count=info.instanceCount,
                resources=_resources(info, of_device=False),
                placements=self._placements(handle, info.id),
            )
        return tuple(profiles.values())

    def _placements(self, handle: Any, profile_id: int) -> tuple[MigPlacement, ...]:
        nvml = self._nvml
        count = ctypes.c_uint(0)
        call = nvml.nvmlDeviceGetGpuInstancePossiblePlacements
        self._call(call, handle, profile_id, None, ctypes.byref(count))
        placements = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(call, handle, profile_id, placements, ctypes.byref(count))
        return tuple(MigPlacement(p.start, p.size) for p in placements[: count.value])

    def _mig_devices(
        self, parent: _Parent, profiles: tuple[MigProfile, ...], scan: _Scan
    ) -> tuple[MigDevice, ...]:
        nvml = self._nvml
        names = {profile.profile_id: profile.name for profile in profiles}
        devices: list[MigDevice] = []
        for slot in range(self._call(nvml.nvmlDeviceGetMaxMigDeviceCount, parent.handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, slot)
            except nvml.NVMLError_NotFound:
                continue  # an empty slot
            except nvml.NVMLError as err:
                reason = f"MIG device {slot}: nvmlDeviceGetMigDeviceHandleByIndex: {err}"
                self._skip(scan, SkippedDevice(parent.index, reason), err)
                continue
            try:
                devices.append(self._mig_device(parent, mig, names, scan.nodes))
            except _CallFailedError as err:
                self._skip(scan, SkippedDevice(parent.index, f"MIG device {slot}: {err}"), err.error)
        return tuple(sorted(devices, key=lambda d: (d.placement.start, d.compute_placement.start)))

    def _skip(self, scan: _Scan, skipped: SkippedDevice, error: Exception) -> None:
        """Skip a device NVML failed on, unless the host driver went away: that is no fact about
        this device, and skipping it and the ones after would unpublish live devices (a rescan
        racing a driver upgrade), so the whole scan fails and is retried."""
        if host_driver_gone(self._nvml, error):
            raise DiscoveryError(f"the host driver went away during the scan: {skipped.reason}")
        scan.skipped.append(skipped)

    def _mig_device(self, parent: _Parent, mig: Any, names: dict[int, str], nodes: DriverNodes) -> MigDevice:
        nvml = self._nvml
        gi_id = self._call(nvml.nvmlDeviceGetGpuInstanceId, mig)
        ci_id = self._call(nvml.nvmlDeviceGetComputeInstanceId, mig)
        attributes = self._call(nvml.nvmlDeviceGetAttributes, mig)
        gpu_instance = self._call(nvml.nvmlDeviceGetGpuInstanceById, parent.handle, gi_id)
        gi_info = self._call(nvml.nvmlGpuInstanceGetInfo, gpu_instance)
        ci_info = self._call(
            nvml.nvmlComputeInstanceGetInfo,
            self._call(nvml.nvmlGpuInstanceGetComputeInstanceById, gpu_instance, ci_id),
        )
        gi_profile = names.get(gi_info.profileId, f"profile{gi_info.profileId}")
        full = attributes.computeInstanceSliceCount == attributes.gpuInstanceSliceCount
        return MigDevice(
            uuid=_text(self._call(nvml.nvmlDeviceGetUUID, mig)),
            parent_minor=parent.minor,
            parent_uuid=parent.uuid,
            gi_id=gi_id,
            ci_id=ci_id,
            profile=gi_profile if full else f"{attributes.computeInstanceSliceCount}c.{gi_profile}",
            gi_profile_id=gi_info.profileId,
            placement=MigPlacement(gi_info.placement.start, gi_info.placement.size),
            compute_placement=MigPlacement(ci_info.placement.start, ci_info.placement.size),
            full_gpu_instance=full,
            resources=_resources(attributes, of_device=True),
            gi_caps_minor=nodes.gi_minor(parent.minor, gi_id),
            ci_caps_minor=nodes.ci_minor(parent.minor, gi_id, ci_id),
        )

    def mig_device(self, gpu_uuid: str, gpu_instance: int, compute_instance: int) -> MigDevice | None:
        """The MIG device at this GPU and compute instance, read as discovery reads it; None if absent.

        For MIG devices made after discovery: the GPU's profile names and the nvidia-caps table are
        read once per library and kept.
        """
        nvml = self._nvml
        try:
            handle = self._call(nvml.nvmlDeviceGetHandleByUUID, gpu_uuid)
            parent = _Parent(handle, -1, self._call(nvml.nvmlDeviceGetMinorNumber, handle), gpu_uuid)
            if gpu_uuid not in self._profile_names:
                self._profile_names[gpu_uuid] = {p.profile_id: p.name for p in self._mig_profiles(handle)}
            if self._nodes is None:
                self._nodes = read_driver_nodes(self.proc_root)
            for slot in range(self._call(nvml.nvmlDeviceGetMaxMigDeviceCount, handle)):
                try:
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except nvml.NVMLError_NotFound:
                    continue
                ids = (
                    self._call(nvml.nvmlDeviceGetGpuInstanceId, mig),
                    self._call(nvml.nvmlDeviceGetComputeInstanceId, mig),
                )
                if ids == (gpu_instance, compute_instance):
                    return self._mig_device(parent, mig, self._profile_names[gpu_uuid], self._nodes)
        except (_CallFailedError, nvml.NVMLError) as err:
            raise DiscoveryError(
                f"cannot read MIG device {gpu_instance}/{compute_instance} of {gpu_uuid}: {err}"
            ) from None
        return None

    def _pcie_root(self, bus_id: str) -> str | None:
        """`pci<domain>:<bus>` of the root complex, from where /sys/bus/pci/devices/<bdf> points."""
        link = self._sys_root / "bus" / "pci" / "devices" / bus_id
        try:
            target = Path(os.path.normpath(link.parent / os.readlink(link)))
        except OSError:
            return None
        try:
            parts = target.relative_to(self._sys_root / "devices").parts
        except ValueError:
            return None
        if len(parts) < 2 or not parts[0].startswith("pci") or parts[-1] != bus_id:
            return None
        return parts[0]

    def _sysfs_numa_node(self, bus_id: str) -> int | None:
        try:
            node = int((self._sys_root / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None
