"""MIG devices made and removed through NVML (`pynvml`), as `nvidia-smi mig -cgi/-cci/-dci/-dgi` do.

Holds an NVML reference of its own (nvmlInit is reference-counted), so it outlives discovery's.
The MIG device a new compute instance makes is read back exactly as discovery reads MIG devices.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pynvml

from dradriver.backend.nvml.discovery import NvmlLibrary
from dradriver.discovery.errors import DiscoveryError
from dradriver.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile
from dradriver.mig import MigError, MigFailure, compute_profile_index

_T = TypeVar("_T")
#: NVML_ERROR_* codes with a reason of their own.
_REASONS: dict[int, MigFailure] = {3: "not_supported", 19: "in_use", 23: "insufficient_resources"}
#: Compute instances per GPU instance at most (NVML's limit on every MIG GPU so far).
_MAX_COMPUTE_INSTANCES = 8
_MAX_GPU_INSTANCES = 8


class NvmlMigControl:
    def __init__(self, *, library_path: str | None = None, proc_root: Path = Path("/proc")) -> None:
        self._nvml: Any = pynvml
        self._library = NvmlLibrary(library_path=library_path, proc_root=proc_root)

    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            raise MigError(_REASONS.get(err.value, "failed"), f"{fn.__name__}: {err}") from None

    def _absent(self, fn: Callable[..., _T], *args: Any) -> _T | None:
        """A lookup by id: NOT_FOUND (or INVALID_ARGUMENT for an id out of range) means absent."""
        nvml = self._nvml
        try:
            return fn(*args)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            return None
        except nvml.NVMLError as err:
            raise MigError(_REASONS.get(err.value, "failed"), f"{fn.__name__}: {err}") from None

    def _handle(self, gpu_uuid: str) -> Any:
        return self._call(self._nvml.nvmlDeviceGetHandleByUUID, gpu_uuid)

    def create_gpu_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> int:
        nvml = self._nvml
        spot = nvml.c_nvmlGpuInstancePlacement_t(placement.start, placement.size)
        instance = self._call(
            nvml.nvmlDeviceCreateGpuInstanceWithPlacement,
            self._handle(gpu.uuid),
            profile.profile_id,
            ctypes.byref(spot),
        )
        return int(self._call(nvml.nvmlGpuInstanceGetInfo, instance).id)

    def create_compute_instance(self, gpu: Gpu, gpu_instance: int) -> MigDevice:
        nvml = self._nvml
        instance = self._call(nvml.nvmlDeviceGetGpuInstanceById, self._handle(gpu.uuid), gpu_instance)
        profile_id = self._call(nvml.nvmlGpuInstanceGetInfo, instance).profileId
        profile = next((p for p in gpu.mig_profiles if p.profile_id == profile_id), None)
        if profile is None:
            raise MigError(
                "not_supported",
                f"GPU instance {gpu_instance} has profile {profile_id}, not in the GPU's table",
            )
        compute_profile = self._call(
            nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            instance,
            compute_profile_index(profile.slice_count),
            nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        compute = self._call(nvml.nvmlGpuInstanceCreateComputeInstance, instance, compute_profile.id)
        compute_id = int(self._call(nvml.nvmlComputeInstanceGetInfo_v2, compute).id)
        try:
            device = self._library.mig_device(gpu.uuid, gpu_instance, compute_id)
        except DiscoveryError as err:
            raise MigError("failed", str(err)) from None
        if device is None:
            raise MigError(
                "failed",
                f"the new compute instance {gpu_instance}/{compute_id} is not listed as a MIG device",
            )
        return device

    def destroy(self, gpu_uuid: str, gpu_instance: int) -> bool:
        nvml = self._nvml
        instance = self._absent(nvml.nvmlDeviceGetGpuInstanceById, self._handle(gpu_uuid), gpu_instance)
        if instance is None:
            return False
        for compute_id in range(_MAX_COMPUTE_INSTANCES):
            compute = self._absent(nvml.nvmlGpuInstanceGetComputeInstanceById, instance, compute_id)
            if compute is not None:
                self._call(nvml.nvmlComputeInstanceDestroy, compute)
        self._call(nvml.nvmlGpuInstanceDestroy, instance)
        return True

    def find_gpu_instance(self, gpu_uuid: str, profile_id: int, placement: MigPlacement) -> int | None:
        nvml = self._nvml
        count = ctypes.c_uint(_MAX_GPU_INSTANCES)
        instances = (nvml.c_nvmlGpuInstance_t * _MAX_GPU_INSTANCES)()
        self._call(
            nvml.nvmlDeviceGetGpuInstances,
            self._handle(gpu_uuid),
            profile_id,
            instances,
            ctypes.byref(count),
        )
        for instance in instances[: count.value]:
            info = self._call(nvml.nvmlGpuInstanceGetInfo, instance)
            if info.placement.start == placement.start:
                return int(info.id)
        return None

    def close(self) -> None:
        self._library.close()
