"""Creating a claim's MIG devices at their allocated placements, and removing them, crash-safely.

Each step is recorded before the next one happens (see `MigRecord`). Calls are serialized (the
driver's), so one MIG device at a time is made or removed; `settled` keeps a rescan of the node
from seeing one half-made. A GPU instance is removed only when it is the one recorded:
found at the recorded profile and placement, and with the recorded id once that is known, so a
MIG device an operator made (even at a placement we used before) is never touched.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from dradriver import logs
from dradriver.devicemodel import PossibleMig
from dradriver.discovery import MigDevice, MigPlacement
from dradriver.mig import MigControl, MigError
from dradriver.prepare.checkpoint import MigRecord

log = logs.get_logger(component="mig")


class MigMetrics(Protocol):
    """Counters of MIG reconfiguration; must be cheap and never raise."""

    def mig_created(self) -> None: ...

    def mig_destroyed(self) -> None: ...

    def mig_failed(self, operation: str, reason: str) -> None: ...


class NoMigMetrics:
    """When metrics are not served nothing is counted."""

    def mig_created(self) -> None:
        """Not counted."""

    def mig_destroyed(self) -> None:
        """Not counted."""

    def mig_failed(self, operation: str, reason: str) -> None:
        """Not counted."""


def intent(placement: PossibleMig) -> MigRecord:
    """What is recorded before anything is created."""
    return MigRecord(
        parent_uuid=placement.parent.uuid,
        profile=placement.profile.name,
        profile_id=placement.profile.profile_id,
        placement_start=placement.placement.start,
        placement_size=placement.placement.size,
    )


class MigManager:
    def __init__(self, open_control: Callable[[], MigControl], metrics: MigMetrics | None = None) -> None:
        self._open_control = open_control
        self._control: MigControl | None = None
        self.metrics: MigMetrics = metrics or NoMigMetrics()
        #: Held for every creation and removal (which the driver's calls make one at a time), and
        #: by `settled`: a rescan never sees a GPU instance we made but have not recorded.
        self._reconfigure = threading.Lock()

    def _get_control(self) -> MigControl:
        """Opened on first use (within a call): a node that never creates MIG devices never
        reconfigures them."""
        if self._control is None:
            self._control = self._open_control()
        return self._control

    @contextlib.contextmanager
    def settled(self) -> Iterator[None]:
        """No MIG device is being made or removed while the block runs (a rescan of the node)."""
        with self._reconfigure:
            yield

    def create(self, placement: PossibleMig, record: Callable[[MigRecord], None]) -> MigDevice:
        """Create the MIG device; `record` must persist the GPU instance before this goes on.

        On failure nothing created is left behind unless even removing it failed, and then the
        last recorded step says what to remove later.
        """
        control = self._get_control()
        gpu = placement.parent
        step = intent(placement)
        with self._reconfigure:
            try:
                gpu_instance = control.create_gpu_instance(gpu, placement.profile, placement.placement)
                step = step.model_copy(update={"gi_id": gpu_instance})
                record(step)
                # Recovery removes a GPU instance with all its compute instances: the compute
                # instance id is recorded with the rest of the prepared claim, not before.
                device = control.create_compute_instance(gpu, gpu_instance)
            except MigError as err:
                self.metrics.mig_failed("create", err.reason)
                self._remove_after_failure(control, step)
                raise
            except BaseException:
                self._remove_after_failure(control, step)
                raise
        self.metrics.mig_created()
        log.info(
            "created MIG device",
            gpu=gpu.uuid,
            profile=placement.profile.name,
            placement=placement.placement.start,
            gpu_instance=gpu_instance,
            uuid=device.uuid,
        )
        return device

    def _remove_after_failure(self, control: MigControl, step: MigRecord) -> None:
        try:
            self._destroy_locked(control, step)
        except MigError as err:
            log.error("could not remove a half-created MIG device; recovery retries", error=str(err))

    def destroy(self, record: MigRecord) -> None:
        """Remove the recorded MIG device if it (still) exists. Raises MigError (e.g. `in_use`)."""
        control = self._get_control()
        with self._reconfigure:
            self._destroy_locked(control, record)

    def _destroy_locked(self, control: MigControl, record: MigRecord) -> None:
        placement = MigPlacement(record.placement_start, record.placement_size)
        try:
            found = control.find_gpu_instance(record.parent_uuid, record.profile_id, placement)
            if found is None:
                return  # never created, or already removed
            if record.gi_id is not None and found != record.gi_id:
                log.warning(
                    "a GPU instance at a placement we used is not the one we made: leaving it",
                    gpu=record.parent_uuid,
                    profile=record.profile,
                    placement=record.placement_start,
                    recorded=record.gi_id,
                    found=found,
                )
                return
            # With no id recorded, the instance at the recorded placement is the one a crash
            # interrupted us making: the claim still holds that placement, nobody else may use it.
            if control.destroy(record.parent_uuid, found):
                self.metrics.mig_destroyed()
                log.info(
                    "destroyed MIG device",
                    gpu=record.parent_uuid,
                    profile=record.profile,
                    placement=record.placement_start,
                    gpu_instance=found,
                )
        except MigError as err:
            self.metrics.mig_failed("destroy", err.reason)
            raise

    def close(self) -> None:
        with self._reconfigure:  # not in the middle of a reconfiguration
            if self._control is not None:
                self._control.close()
                self._control = None
