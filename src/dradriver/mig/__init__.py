"""Making MIG devices on demand: one small interface, two backends (NVML and fake GPUs).

A MIG device made here is a GPU instance at a placement the scheduler allocated plus one
compute instance spanning it. Creation is two steps so that the caller can record the GPU
instance before the compute instance exists (a crash in between leaves a GPU instance that
recovery must find and remove). Errors carry NVML's reason in a bounded form, for messages and
metrics. Which devices are ours to remove is the caller's business: a backend removes whatever
GPU instance it is told to.
"""

from __future__ import annotations

from typing import Literal, Protocol

from dradriver.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile

__all__ = ["MigControl", "MigError", "MigFailure", "compute_profile_index"]

#: Why NVML refused: no room at the placement (or no instance of the profile left), the instance
#: still has users, MIG is off or the call unsupported, anything else.
MigFailure = Literal["insufficient_resources", "in_use", "not_supported", "failed"]

#: NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE: the compute instance profile index for n compute slices.
_COMPUTE_PROFILE_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


class MigError(Exception):
    """A MIG reconfiguration NVML (or the fake) refused; `reason` is bounded, the message is not."""

    def __init__(self, reason: MigFailure, message: str) -> None:
        super().__init__(message)
        self.reason: MigFailure = reason


def compute_profile_index(compute_slices: int) -> int:
    """The compute instance profile that spans a GPU instance of `compute_slices` slices."""
    try:
        return _COMPUTE_PROFILE_INDEX[compute_slices]
    except KeyError:
        raise MigError("not_supported", f"no compute instance profile has {compute_slices} slices") from None


class MigControl(Protocol):
    """Creates and destroys GPU and compute instances; safe to call from several threads, but
    callers serialize the calls for one GPU (NVML reconfigures one GPU at a time)."""

    def create_gpu_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> int:
        """The id of a new GPU instance of `profile` at exactly `placement`."""
        ...

    def create_compute_instance(self, gpu: Gpu, gpu_instance: int) -> MigDevice:
        """A compute instance spanning the GPU instance: the MIG device, as discovery shows it."""
        ...

    def destroy(self, gpu_uuid: str, gpu_instance: int) -> bool:
        """Remove the GPU instance and its compute instances; False when it does not exist."""
        ...

    def find_gpu_instance(self, gpu_uuid: str, profile_id: int, placement: MigPlacement) -> int | None:
        """The id of the GPU instance of profile `profile_id` at `placement`, if there is one."""
        ...

    def close(self) -> None: ...
