"""Start-up: make the checkpoint and the CDI directory agree again after a restart or a crash.

The boot of what is on disk decides first: specs and records of a previous boot are void (the
kubelet prepares its claims again), so they are removed and the boot marker notes this boot.
Otherwise the checkpoint is taken as it is, or, when it is unusable, rebuilt from our spec files
(names are lost). Half-prepared claims (PrepareStarted) are rolled back, spec files and device
metadata no prepared claim names are removed as orphans, and prepared claims whose spec or device
metadata was deleted or changed get it written again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dradriver import logs
from dradriver.devicemodel import Hardware
from dradriver.discovery import Gpu, MigDevice
from dradriver.files.write import storage_error
from dradriver.mig import MigError
from dradriver.names import uid_error
from dradriver.prepare import cdi
from dradriver.prepare.checkpoint import CheckpointData, ClaimRecord, ClaimState, DeviceRecord
from dradriver.prepare.context import ClaimContext
from dradriver.prepare.ledger import OnDisk
from dradriver.prepare.metadata_files import restore_metadata

log = logs.get_logger(component="prepare")


@dataclass
class Recovery:
    """What start-up found and fixed, for the log and for tests."""

    quarantined: Path | None = None
    rebuilt_from_cdi: list[str] = field(default_factory=list)
    cleared_after_reboot: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    #: Claims whose rollback failed (a MIG device could not be removed yet): kept PrepareStarted.
    rollback_failed: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    #: Prepared claims whose spec was missing or changed, written again.
    specs_rewritten: list[str] = field(default_factory=list)
    #: Claims whose device metadata was removed: of no prepared claim.
    metadata_removed: list[str] = field(default_factory=list)
    #: Prepared claims whose device metadata was missing or changed, written again.
    metadata_rewritten: list[str] = field(default_factory=list)
    temp_files_removed: int = 0


def restore_specs(
    cdi_dir: cdi.CdiDirectory, records: Sequence[ClaimRecord]
) -> tuple[list[str], dict[str, str]]:
    """Rewrite (atomically) the spec of each prepared claim whose file is missing or differs
    from what was written (deleted, emptied, overwritten): the UIDs rewritten, and the error
    of each that cannot be. A record of an older version, which kept no spec, is not checked."""
    stale = {
        r.uid: r.cdi_spec
        for r in records
        if r.cdi_spec is not None
        and r.state is ClaimState.PREPARE_COMPLETED
        and cdi_dir.read(r.uid) != r.cdi_spec
    }
    if not stale:
        return [], {}
    log.warning("CDI specs of prepared claims were missing or changed: rewriting", claims=sorted(stale))
    errors = {
        uid: "its CDI spec was missing or changed and "
        + str(storage_error("rewrite it", cdi_dir.path, err) if isinstance(err, OSError) else err)
        for uid, err in cdi_dir.write_many(stale).items()
    }
    return sorted(stale.keys() - errors.keys()), errors


class StartupRecovery:
    def __init__(self, context: ClaimContext) -> None:
        self._context = context

    def run(self, devices: Mapping[str, Hardware]) -> Recovery:
        """Recover, with the node's `devices` (to name the hardware of rebuilt records)."""
        # A full or read-only disk fails start-up here, before a spec or a record is touched.
        self._context.ledger.check_writable()
        self._context.cdi_dir.check_writable()
        report = Recovery(temp_files_removed=len(self._context.cdi_dir.remove_temp_files()))
        disk = self._context.ledger.read_disk()
        report.quarantined = disk.quarantined
        if disk.error is not None:
            self._log_unusable(disk)
        state = self._starting_state(disk, report, devices)
        claims = self._roll_back(state, report)
        for uid in self._context.cdi_dir.claim_uids():
            if uid not in claims or claims[uid].state is not ClaimState.PREPARE_COMPLETED:
                self._context.cdi_dir.remove(uid)
                report.orphans_removed.append(uid)
        report.specs_rewritten, failed = restore_specs(self._context.cdi_dir, list(claims.values()))
        for uid, error in failed.items():
            log.error("a prepared claim's CDI spec cannot be rewritten", uid=uid, error=error)
        self._recover_metadata(claims, report)
        self._context.ledger.install(state, claims, disk.last_boot)
        # The GPUs' share daemons as the kept shares need them: adopted, started again or stopped.
        self._context.shares.recover(claims.values())
        return report

    def _recover_metadata(self, claims: Mapping[str, ClaimRecord], report: Recovery) -> None:
        """The device metadata as the kept claims need it: other claims' removed, theirs rewritten
        where missing or changed (a rebuilt record names none: its files are kept as they are)."""
        files = self._context.metadata
        report.metadata_removed = files.remove_all_but(
            uid for uid, record in claims.items() if record.state is ClaimState.PREPARE_COMPLETED
        )
        report.metadata_rewritten, failed = restore_metadata(files, list(claims.values()))
        for uid, error in failed.items():
            log.error("a prepared claim's device metadata cannot be rewritten", uid=uid, error=error)

    def _log_unusable(self, disk: OnDisk) -> None:
        if self._before_this_boot(disk.last_boot):  # expected after a power failure
            log.warning(
                "checkpoint of a previous boot unusable: moved aside (its claims are void now)",
                error=str(disk.error),
                moved_to=str(disk.quarantined),
            )
        else:
            log.error(
                "checkpoint unusable: moved aside, rebuilding prepared claims from the CDI directory",
                error=str(disk.error),
                moved_to=str(disk.quarantined),
            )

    def _starting_state(
        self, disk: OnDisk, report: Recovery, devices: Mapping[str, Hardware]
    ) -> CheckpointData:
        """The state to recover from: empty after a reboot (the previous boot's specs removed),
        rebuilt from the specs when the checkpoint is unusable, else the checkpoint."""
        loaded = disk.checkpoint
        # The boot of what is on disk: the checkpoint's, or with none readable the marker's (saves
        # are not fsynced, so a power failure may cost the checkpoint; the specs are that boot's).
        if self._before_this_boot(loaded.boot_id if loaded is not None else disk.last_boot):
            report.cleared_after_reboot = sorted(
                self._context.cdi_dir.claim_uids() if loaded is None else loaded.claims
            )
            for uid in report.cleared_after_reboot:
                self._context.cdi_dir.remove(uid)
            return CheckpointData(boot_id=self._context.ledger.boot_id)
        if loaded is None:
            state = self._rebuild_from_cdi(devices)
            report.rebuilt_from_cdi = sorted(state.claims)
            return state
        return loaded.model_copy(update={"boot_id": self._context.ledger.boot_id})

    def _roll_back(self, state: CheckpointData, report: Recovery) -> dict[str, ClaimRecord]:
        """Release the half-prepared claims: the claims kept (the prepared ones, and those whose
        MIG device could not be removed yet)."""
        claims = {uid: r for uid, r in state.claims.items() if r.state is ClaimState.PREPARE_COMPLETED}
        remaining = dict(state.claims)  # whose shares keep a share daemon running
        for record in [r for r in state.claims.values() if r.state is ClaimState.PREPARE_STARTED]:
            try:
                self._context.release(record, prepared=remaining.values)
            except MigError as err:
                log.error(
                    "could not roll back a half-prepared claim: its MIG device stays recorded",
                    uid=record.uid,
                    error=str(err),
                )
                claims[record.uid] = record
                report.rollback_failed.append(record.uid)
                continue
            del remaining[record.uid]
            report.rolled_back.append(record.uid)
        return claims

    def _before_this_boot(self, boot_id: str | None) -> bool:
        return bool(boot_id and self._context.ledger.boot_id and boot_id != self._context.ledger.boot_id)

    def _rebuild_from_cdi(self, devices: Mapping[str, Hardware]) -> CheckpointData:
        """Our spec files say which claims are prepared and with which devices; names are lost."""
        claims: dict[str, ClaimRecord] = {}
        for uid in self._context.cdi_dir.claim_uids():
            spec = self._context.cdi_dir.read(uid)
            if spec is None or uid_error(uid) is not None:
                continue  # unparseable or not ours after all: removed as an orphan
            claims[uid] = ClaimRecord(
                uid=uid,
                namespace="",
                name="",
                state=ClaimState.PREPARE_COMPLETED,
                devices=tuple(self._rebuilt_device(uid, entry, devices) for entry in spec.get("devices", [])),
                cdi_file=str(self._context.cdi_dir.file_for(uid)),
                cdi_spec=spec,
                recovered=True,
            )
        return CheckpointData(boot_id=self._context.ledger.boot_id, claims=claims)

    def _rebuilt_device(
        self, uid: str, entry: Mapping[str, object], devices: Mapping[str, Hardware]
    ) -> DeviceRecord:
        qualified = f"{cdi.kind(self._context.driver_name)}={entry.get('name', '')}"
        device = str(entry.get("name", "")).removeprefix(f"{uid}-")
        hardware = devices.get(device)
        return DeviceRecord(
            pool=self._context.pool_name,
            device=device,
            cdi_device_ids=(qualified,),
            uuid=hardware.uuid if isinstance(hardware, Gpu | MigDevice) else "",
        )
