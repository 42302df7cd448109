"""Undoing what prepare set up for a claim: its GPU shares, its sharing, the MIG devices made for
it, its spec and device metadata.

Used wherever a record is let go: unprepare, a prepare that fails or replaces an earlier attempt,
a stale holder freed, and recovery's rollback of half-prepared claims.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dradriver.prepare.cdi import CdiDirectory
from dradriver.prepare.checkpoint import ClaimRecord
from dradriver.prepare.gpu_share_daemons import ShareDaemons
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.metadata_files import MetadataFiles
from dradriver.prepare.mig import MigManager
from dradriver.prepare.sharing_settings import SharingControl


class Release:
    def __init__(
        self,
        *,
        sharing: SharingControl,
        mig: MigManager,
        cdi_dir: CdiDirectory,
        shares: ShareDaemons,
        ledger: Ledger,
        metadata: MetadataFiles,
    ) -> None:
        self._ledger = ledger
        self._metadata = metadata
        self._sharing = sharing
        self._shares = shares
        self._mig = mig
        self._cdi = cdi_dir

    def __call__(
        self,
        record: ClaimRecord,
        *,
        keep_cdi: bool = False,
        prepared: Callable[[], Iterable[ClaimRecord]] | None = None,
    ) -> None:
        """Release sharing, destroy the MIG devices made for the claim and remove the spec and
        the device metadata (the caller forgets the record); safe to repeat after a crash. A
        MigError (e.g. a MIG device still in use) leaves the spec, so that the claim stays whole
        for the kubelet, or recovery, to try again. `prepared`: the claims whose shares keep a
        GPU's share daemon running, the ledger's unless recovery says otherwise."""
        self._shares.release(record, self._ledger.records if prepared is None else prepared)
        by_sharing: dict[str, list[str]] = {}
        for device in record.devices:
            if device.sharing:
                by_sharing.setdefault(device.sharing, []).append(device.uuid)
        for description, uuids in by_sharing.items():
            self._sharing.release(record.uid, description, uuids)
        for device in record.devices:
            if device.mig is not None:
                self._mig.destroy(device.mig)
        if not keep_cdi:
            self._cdi.remove(record.uid)
            self._metadata.remove(record)
