"""The ledger of prepared claims: the one owner of the prepared state, its checkpoint and the
devices the claims hold.

Locking rule: every change comes from a prepare or unprepare call, and the driver serializes those
(`GpuDriver._exclusive`: one call at a time in this process, and across instances during a rolling
update), so changes never race each other and a call's reads of its own claims stay true until it
answers. The state lock only keeps readers on other threads (metrics, telemetry, the inventory) from
seeing the claims dict mid-change: every read and change of `_state` and every checkpoint read or
write is under it, inside this class, which never calls out while holding it and never hands out
the live dict (records are immutable).

Each method that writes the checkpoint is a transaction: when the write fails it raises
StorageError with memory as it was before the method ran.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dradriver.devicemodel import Hardware
from dradriver.discovery import Gpu, MigDevice
from dradriver.files.write import StorageError
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import (
    CheckpointData,
    CheckpointError,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
    MigRecord,
)
from dradriver.prepare.plan import ClaimPlan, PlannedDevice

#: Prepared devices by the GPU they are on (see `Ledger._holders`).
_Holders = dict[str, list[tuple[ClaimRecord, DeviceRecord]]]


def _silicon(device: Hardware) -> tuple[int, range | None]:
    """The GPU minor a device lives on and the memory slices it takes (None: all of them)."""
    if isinstance(device, Gpu):
        return device.minor, None
    spot = device.placement
    minor = device.parent_minor if isinstance(device, MigDevice) else device.parent.minor
    return minor, range(spot.start, spot.start + spot.size)


def overlaps(a: Hardware | None, b: Hardware) -> bool:
    """Whether two devices share silicon: the same device, a GPU and one of its MIG devices or
    placements, or MIG placements whose memory slices overlap. Two MIG devices of one GPU
    instance (compute instances that split it) do not."""
    if a is None:
        return False
    if isinstance(a, MigDevice) and isinstance(b, MigDevice):
        return a.uuid == b.uuid
    (minor_a, slices_a), (minor_b, slices_b) = _silicon(a), _silicon(b)
    if minor_a != minor_b:
        return False
    return slices_a is None or slices_b is None or bool(set(slices_a) & set(slices_b))


def read_checkpoint(state_dir: Path) -> CheckpointData | None:
    """The checkpoint as it is on disk, for a reader outside `serve` (`dradriver status`); None
    when there is none. Raises CheckpointError or OSError."""
    return CheckpointStore(state_dir).load()


@dataclass(frozen=True)
class OnDisk:
    """What start-up found in the state directory."""

    #: The checkpoint; None when there is none, or when it was unusable (then `error` says why).
    checkpoint: CheckpointData | None
    #: The boot id of the boot marker, or None.
    last_boot: str | None
    error: CheckpointError | None = None
    #: Where the unusable checkpoint was moved.
    quarantined: Path | None = None


class Ledger:
    """The claims prepared on this node (records, kept in the checkpoint) and who holds which
    device. See the module docstring for the locking rule."""

    def __init__(self, store: CheckpointStore, boot_id: str) -> None:
        self._store = store
        self.boot_id = boot_id
        self._state = CheckpointData(boot_id=boot_id)
        self._state_lock = threading.Lock()

    # --- reading ----------------------------------------------------------------------------

    def get(self, uid: str) -> ClaimRecord | None:
        with self._state_lock:
            return self._state.claims.get(uid)

    def records(self) -> list[ClaimRecord]:
        with self._state_lock:
            return list(self._state.claims.values())

    def held_devices(self) -> set[str]:
        """Names of the devices prepared claims hold (or are being prepared with)."""
        with self._state_lock:
            return {d.device for r in self._state.claims.values() for d in r.devices}

    def created_instances(self) -> dict[tuple[str, int], str]:
        """(GPU UUID, GPU instance id) -> placement device, for each MIG device made for a claim."""
        with self._state_lock:
            return self._state.created_gpu_instances()

    # --- start-up ---------------------------------------------------------------------------

    def created_on_disk(self) -> dict[tuple[str, int], str]:
        """The MIG devices an earlier run of this boot made for claims, as its checkpoint names
        them (recovery settles them), before anything is loaded. An unreadable checkpoint names
        none: the MIG devices it named then count as an operator's, published and kept as they are.
        """
        with self._state_lock:
            try:
                loaded = self._store.load()
            except (CheckpointError, OSError):
                return {}
        if loaded is None or (loaded.boot_id and loaded.boot_id != self.boot_id):
            return {}  # MIG devices do not survive a reboot
        return loaded.created_gpu_instances()

    def check_writable(self) -> None:
        """StorageError unless the checkpoint can be written now."""
        with self._state_lock:
            self._store.check_writable()

    def read_disk(self) -> OnDisk:
        """The checkpoint and boot marker as start-up finds them; an unusable checkpoint is
        moved aside."""
        with self._state_lock:
            last_boot = self._store.last_boot()
            try:
                return OnDisk(self._store.load(), last_boot)
            except CheckpointError as err:
                return OnDisk(None, last_boot, err, self._store.quarantine())

    def install(self, state: CheckpointData, claims: dict[str, ClaimRecord], last_boot: str | None) -> None:
        """Start from `state` with these claims, written to the checkpoint; the boot marker first
        notes this boot's saves begin, once the previous boot's specs are gone."""
        with self._state_lock:
            # A model_copy keeps the fields a newer version wrote at the top level.
            self._state = state.model_copy(update={"boot_id": self.boot_id, "claims": claims})
            if self.boot_id and last_boot != self.boot_id:
                self._store.mark_boot(self.boot_id)
            self._store.save(self._state)

    def reload_if_changed(self) -> int | None:
        """Take the checkpoint as another instance left it, if it changed on disk: the number of
        claims it holds, or None when nothing was reloaded. Raises CheckpointError when the file
        cannot be read (ours stays; the next save replaces the bad file with it)."""
        with self._state_lock:
            if not self._store.changed_on_disk():
                return None
            loaded = self._store.load()
            self._state = (
                loaded.model_copy(update={"claims": dict(loaded.claims)})
                if loaded is not None
                else CheckpointData(boot_id=self.boot_id)
            )
            return len(self._state.claims)

    # --- prepare ----------------------------------------------------------------------------

    def reserve(
        self,
        reservations: Sequence[tuple[ClaimPlan, ClaimRecord]],
        replaced: Sequence[str],
        devices: Mapping[str, Hardware],
    ) -> dict[str, str]:
        """Drop the `replaced` records and record each plan's PrepareStarted record unless one of
        its devices is held by another claim (on the node's `devices`): the error of each plan
        that is not, by claim UID.

        The checkpoint is written now only when recovery needs these records: earlier records were
        replaced (their spec files removed), or sharing changes a GPU or a MIG device is made (its
        steps are recorded anyway). Otherwise a crash leaves spec files without records, orphans
        recovery removes, and the call's write of PrepareCompleted is its only one. A failed write
        raises StorageError with the records as they were."""
        conflicts: dict[str, str] = {}
        started: list[ClaimRecord] = []
        with self._state_lock:
            dropped = {uid: r for uid in replaced if (r := self._state.claims.pop(uid, None)) is not None}
            holders = self._holders(devices)
            for plan, record in reservations:
                conflict = _first_conflict(plan, holders, devices)
                if conflict is not None:
                    conflicts[plan.claim.uid] = conflict
                    continue
                self._state.claims[record.uid] = record
                _hold(holders, record, devices)
                started.append(record)
            if replaced or any(d.sharing or d.mig is not None for r in started for d in r.devices):
                try:
                    self._store.save(self._state)
                except StorageError:
                    for record in started:
                        del self._state.claims[record.uid]
                    self._state.claims.update(dropped)
                    raise
        return conflicts

    def stale_candidates(
        self, planned: Sequence[ClaimPlan], devices: Mapping[str, Hardware]
    ) -> dict[tuple[str, ClaimRef], ClaimRecord]:
        """The prepared claims (with a name to look up) holding a device of these plans, each by
        (its UID, the claim it blocks)."""
        with self._state_lock:
            holders = self._holders(devices)
            return {
                (h.uid, plan.claim): h
                for plan in planned
                for d in plan.devices
                if (h := _conflict(plan.claim.uid, d, holders, devices)) is not None
                and h.state is ClaimState.PREPARE_COMPLETED
                and h.name
            }

    def record_mig(self, uid: str, device: str, step: MigRecord) -> None:
        """Save a MIG creation step in the claim's record."""
        with self._state_lock:
            record = self._state.claims[uid]
            changed = tuple(
                d.model_copy(update={"mig": step}) if d.device == device else d for d in record.devices
            )
            self._state.claims[uid] = record.model_copy(update={"devices": changed})
            self._store.save(self._state)

    def put(self, record: ClaimRecord) -> None:
        """Replace the claim's record with `record` (in memory)."""
        with self._state_lock:
            self._state.claims[record.uid] = record

    def complete(
        self, written: Mapping[str, tuple[Mapping[str, object] | None, Mapping[str, object] | None]]
    ) -> list[ClaimRecord]:
        """Mark the records of `written` PrepareCompleted with the spec and device metadata
        written for each (in memory; the caller writes the checkpoint)."""
        with self._state_lock:
            completed = []
            for uid, (spec, metadata) in written.items():
                record = self._state.claims[uid].model_copy(
                    update={"state": ClaimState.PREPARE_COMPLETED, "cdi_spec": spec, "metadata": metadata}
                )
                self._state.claims[uid] = record
                completed.append(record)
            return completed

    def persist(self) -> None:
        """Write the checkpoint as it is in memory."""
        with self._state_lock:
            self._store.save(self._state)

    def drop(self, uids: Sequence[str]) -> None:
        """Forget the records of these claims (in memory; the caller writes the checkpoint)."""
        with self._state_lock:
            for uid in uids:
                self._state.claims.pop(uid, None)

    # --- unprepare --------------------------------------------------------------------------

    def forget(self, uids: Sequence[str]) -> None:
        """Drop the records of these claims, in memory only if the checkpoint write succeeds."""
        with self._state_lock:
            gone = {uid: record for uid in uids if (record := self._state.claims.pop(uid, None)) is not None}
            if not gone:
                return
            try:
                self._store.save(self._state)
            except StorageError:
                self._state.claims.update(gone)
                raise

    # --- holders (the state lock held) ------------------------------------------------------

    def _holders(self, devices: Mapping[str, Hardware]) -> _Holders:
        """Every prepared device by the silicon it is on: conflict checks look at a handful of
        devices instead of every prepared one (O(claims) per call, not O(claims²))."""
        holders: _Holders = {}
        for record in self._state.claims.values():
            _hold(holders, record, devices)
        return holders


def _first_conflict(plan: ClaimPlan, holders: _Holders, devices: Mapping[str, Hardware]) -> str | None:
    ref = plan.claim
    for device in plan.devices:
        holder = _conflict(ref.uid, device, holders, devices)
        if holder is not None:
            return (
                f"claim {ref}: device {device.name} is already prepared for claim "
                f"{holder.namespace}/{holder.name} ({holder.uid}) and cannot be shared"
            )
    return None


def _gpu_key(device_name: str, devices: Mapping[str, Hardware]) -> str:
    """What two devices must share to overlap: the GPU (by minor) a device or placement is on."""
    hardware = devices.get(device_name)
    return f"device {device_name}" if hardware is None else f"gpu {_silicon(hardware)[0]}"


def _hold(holders: _Holders, record: ClaimRecord, devices: Mapping[str, Hardware]) -> None:
    for held in record.devices:
        if not held.admin_access:
            holders.setdefault(_gpu_key(held.device, devices), []).append((record, held))


def _conflict(
    uid: str, device: PlannedDevice, holders: _Holders, devices: Mapping[str, Hardware]
) -> ClaimRecord | None:
    if device.admin_access:
        return None
    for other, held in holders.get(_gpu_key(device.name, devices), []):
        if other.uid == uid or (device.share_id is not None and held.share_id is not None):
            continue
        if held.device == device.name or overlaps(devices.get(held.device), device.hardware):
            return other
    return None
