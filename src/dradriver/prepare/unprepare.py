"""Unprepare: the prepare pipeline undone, claim by claim, committed by one checkpoint write.

Each claim's spec is set aside (runtimes ignore it) before its sharing is released and its MIG
devices are removed; the records go with one checkpoint write, and only then the specs and the
device metadata. When the write fails the specs go back and the claims stay prepared, for the
kubelet's retry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from dradriver import logs
from dradriver.files.write import StorageError
from dradriver.mig import MigError
from dradriver.names import uid_error
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.cdi import CdiDirectory
from dradriver.prepare.checkpoint import ClaimRecord
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.metadata_files import MetadataFiles
from dradriver.prepare.release import Release
from dradriver.prepare.sharing_settings import SharingError

log = logs.get_logger(component="prepare")


class Unpreparer:
    def __init__(
        self, ledger: Ledger, cdi_dir: CdiDirectory, metadata: MetadataFiles, release: Release
    ) -> None:
        self._ledger = ledger
        self._cdi = cdi_dir
        self._metadata = metadata
        self._release = release

    def run(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Unprepare the claims: the error of each ("" for success, also for a claim never
        prepared here or unprepared already)."""
        errors: dict[str, str] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            if (problem := uid_error(ref.uid)) is not None:
                errors[ref.uid] = f"claim {ref}: invalid UID {ref.uid!r}: {problem}"
            else:
                refs.setdefault(ref.uid, ref)
        released: dict[str, Path | None] = {}  # the spec of each, set aside until the write
        records = {r.uid: r for r in self._ledger.records()}
        remaining = dict(records)  # whose shares keep a daemon running
        for uid, ref in refs.items():
            errors[uid] = ""  # never prepared here, or already unprepared: success
            record = remaining.get(uid)
            if record is None:
                continue
            try:
                released[uid] = self._release_one(record, remaining.values)
                del remaining[uid]
            except (StorageError, SharingError, MigError) as err:
                errors[uid] = f"claim {ref}: {err}"
        try:
            self._ledger.forget(list(released))
        except StorageError as err:  # still prepared: the specs go back, the kubelet retries
            for uid, aside in released.items():
                if aside is not None:
                    self._cdi.put_back(uid, aside)
                errors[uid] = f"claim {refs[uid]}: not unprepared: {err}"
            return errors
        for uid, aside in released.items():
            if aside is not None:
                aside.unlink(missing_ok=True)
            try:
                self._metadata.remove(records[uid])
            except OSError as err:  # no record names it now: recovery removes it
                log.error("unprepared, its device metadata not removed", claim=str(refs[uid]), error=str(err))
            log.info("unprepared", claim=str(refs[uid]), uid=uid)
        return errors

    def _release_one(self, record: ClaimRecord, prepared: Callable[[], Iterable[ClaimRecord]]) -> Path | None:
        """Set the claim's spec aside and release its devices: where the spec is (None: it had
        none). StorageError with nothing undone, or the release's error with the spec put back."""
        aside = self._cdi.set_aside(record.uid)
        try:
            self._release(record, keep_cdi=True, prepared=prepared)
        except (SharingError, MigError):
            if aside is not None:
                self._cdi.put_back(record.uid, aside)
            raise
        return aside
