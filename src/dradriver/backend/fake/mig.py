"""MIG devices of fake GPUs, made and removed with NVML's rules and kept in a state file.

A real GPU keeps its MIG devices when the process that made them crashes, so the fake keeps
them in `<state-dir>/fake-mig-devices.json` (rewritten atomically after every change) and reads
the file back on start; the profile's own MIG devices are the starting point. It refuses what
NVML refuses, with the same reasons: a placement the profile lacks, one overlapping another GPU
instance, more instances of a profile (or more compute slices) than the GPU has, a second
compute instance where the first spans the GPU instance.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

from dradriver.discovery.model import Gpu, MigDevice, MigPlacement, MigProfile, NodeInventory
from dradriver.discovery.nvidia_caps import driver_layout_minor
from dradriver.files.write import write_atomically
from dradriver.mig import MigError

STATE_FILE = "fake-mig-devices.json"
_MAX_GPU_INSTANCE_ID = 14
_UUID_NAMESPACE = uuid.UUID("0c6f1f5e-3a55-4c1b-9d0e-5b7f5a1e2d90")


class _Instance(BaseModel):
    """One GPU instance; `compute` is the UUID of its compute instance 0 (None: not made yet)."""

    gpu: str
    id: int
    profile_id: int
    start: int
    size: int
    compute: str | None = None


class _State(BaseModel):
    serial: int = 0
    instances: list[_Instance] = []


@dataclass
class FakeMigControl:
    inventory: NodeInventory
    state_file: Path | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _state: _State = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._state = self._load()

    def _load(self) -> _State:
        if self.state_file is not None:
            try:
                return _State.model_validate_json(self.state_file.read_bytes())
            except FileNotFoundError:
                pass
            except (OSError, ValidationError) as err:
                raise MigError("failed", f"fake MIG state {self.state_file} is unreadable: {err}") from None
        return _State(
            instances=[
                _Instance(
                    gpu=gpu.uuid,
                    id=mig.gi_id,
                    profile_id=mig.gi_profile_id,
                    start=mig.placement.start,
                    size=mig.placement.size,
                    compute=mig.uuid,
                )
                for gpu in self.inventory.gpus
                for mig in gpu.mig_devices
            ]
        )

    def _save(self) -> None:
        if self.state_file is None:
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.state_file, json.dumps(self._state.model_dump()).encode(), mode=0o600)

    def _gpu(self, gpu_uuid: str) -> Gpu:
        found = next((g for g in self.inventory.gpus if g.uuid == gpu_uuid), None)
        if found is None:
            raise MigError("failed", f"no GPU {gpu_uuid} on this fake node")
        return found

    def _on(self, gpu_uuid: str) -> list[_Instance]:
        return [i for i in self._state.instances if i.gpu == gpu_uuid]

    def create_gpu_instance(self, gpu: Gpu, profile: MigProfile, placement: MigPlacement) -> int:
        if not gpu.mig_enabled:
            raise MigError("not_supported", f"GPU {gpu.minor}: MIG mode is off")
        if placement not in profile.placements:
            raise MigError("failed", f"{profile.name} has no placement {placement.start}:{placement.size}")
        profiles = {p.profile_id: p for p in gpu.mig_profiles}
        with self._lock:
            present = self._on(gpu.uuid)
            slices = set(range(placement.start, placement.start + placement.size))
            if any(slices & set(range(i.start, i.start + i.size)) for i in present):
                raise MigError(
                    "insufficient_resources", f"{profile.name} at {placement.start} overlaps a GPU instance"
                )
            same = sum(1 for i in present if i.profile_id == profile.profile_id)
            compute = sum(profiles[i.profile_id].slice_count for i in present if i.profile_id in profiles)
            most = max(p.slice_count for p in gpu.mig_profiles)
            if same >= profile.instance_count or compute + profile.slice_count > most:
                raise MigError(
                    "insufficient_resources", f"no {profile.name} instance left on GPU {gpu.minor}"
                )
            used = {i.id for i in present}
            gi = next((n for n in range(1, _MAX_GPU_INSTANCE_ID + 1) if n not in used), None)
            if gi is None:
                raise MigError("insufficient_resources", f"GPU {gpu.minor} has no free GPU instance id")
            self._state.instances.append(
                _Instance(
                    gpu=gpu.uuid,
                    id=gi,
                    profile_id=profile.profile_id,
                    start=placement.start,
                    size=placement.size,
                )
            )
            self._save()
        return gi

    def create_compute_instance(self, gpu: Gpu, gpu_instance: int) -> MigDevice:
        with self._lock:
            instance = next((i for i in self._on(gpu.uuid) if i.id == gpu_instance), None)
            if instance is None:
                raise MigError("failed", f"GPU {gpu.minor} has no GPU instance {gpu_instance}")
            if instance.compute is not None:
                raise MigError(
                    "insufficient_resources", f"GPU instance {gpu_instance} has its compute instance"
                )
            profile = next(p for p in gpu.mig_profiles if p.profile_id == instance.profile_id)
            self._state.serial += 1
            instance.compute = (
                f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{gpu.uuid}/{gpu_instance}/{self._state.serial}')}"
            )
            self._save()
        return MigDevice(
            uuid=instance.compute,
            parent_minor=gpu.minor,
            parent_uuid=gpu.uuid,
            gi_id=gpu_instance,
            ci_id=0,
            profile=profile.name,
            gi_profile_id=profile.profile_id,
            placement=MigPlacement(instance.start, instance.size),
            compute_placement=MigPlacement(0, profile.slice_count),
            full_gpu_instance=True,
            resources=profile.resources,
            gi_caps_minor=driver_layout_minor(gpu.minor, gpu_instance),
            ci_caps_minor=driver_layout_minor(gpu.minor, gpu_instance, 0),
        )

    def destroy(self, gpu_uuid: str, gpu_instance: int) -> bool:
        self._gpu(gpu_uuid)
        with self._lock:
            before = len(self._state.instances)
            self._state.instances = [
                i for i in self._state.instances if not (i.gpu == gpu_uuid and i.id == gpu_instance)
            ]
            if len(self._state.instances) == before:
                return False
            self._save()
        return True

    def find_gpu_instance(self, gpu_uuid: str, profile_id: int, placement: MigPlacement) -> int | None:
        with self._lock:
            return next(
                (
                    i.id
                    for i in self._on(gpu_uuid)
                    if i.profile_id == profile_id and i.start == placement.start
                ),
                None,
            )

    def close(self) -> None:
        """Nothing to release; the state file is written after every change."""
