"""Freeing the devices of a prepare call that claims prepared earlier hold but no longer use.

After a pod holding a GPU is force-deleted, the scheduler may give that GPU to a new pod before
the kubelet has unprepared the old claim; refusing the new claim would leave its pod waiting for
the kubelet's next resync (a minute or more). The API server is the authority here (see
`stale.released_reason`); without one (files, node-only mode) nothing is released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dradriver import logs
from dradriver.devicemodel import Hardware
from dradriver.mig import MigError
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import ClaimRecord
from dradriver.prepare.claims import ClaimNotFoundError, ClaimSource, ClaimSourceError
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.plan import ClaimPlan
from dradriver.prepare.release import Release
from dradriver.prepare.sharing import SharingError
from dradriver.prepare.stale import released_reason

#: How long freeing a stale holder waits for a call already working on that claim.
HOLDER_LOCK_SECONDS = 10.0

log = logs.get_logger(component="prepare")


class StaleHolders:
    def __init__(self, source: ClaimSource, ledger: Ledger, release: Release, driver_name: str) -> None:
        self._source = source
        self._ledger = ledger
        self._release = release
        self._driver_name = driver_name

    def free(self, planned: Sequence[ClaimPlan], devices: Mapping[str, Hardware]) -> None:
        """Unprepare the claims that hold a device of the plans but whose ResourceClaim says they
        cannot be using it any more (deleted, deallocated, reserved for no pod)."""
        if not self._source.authoritative or not planned:
            return
        released: list[str] = []
        for (uid, for_claim), holder in self._ledger.stale_candidates(planned, devices).items():
            if uid in released:
                continue
            reason = self._released_reason(holder)
            if reason is None:
                continue
            ref = ClaimRef(holder.namespace, holder.name, holder.uid)
            if not self._unprepare(ref):
                continue
            released.append(uid)
            log.info(
                "unprepared a claim that no longer uses its devices, for the claim they were allocated to",
                claim=str(ref),
                uid=uid,
                reason=reason,
                for_claim=str(for_claim),
            )

    def _released_reason(self, holder: ClaimRecord) -> str | None:
        """Why the holder's claim no longer uses its devices, as its ResourceClaim says; None if
        it may, or when the API server cannot say."""
        try:
            claim: Mapping[str, Any] | None = self._source.get(holder.namespace, holder.name)
        except ClaimNotFoundError:
            claim = None
        except ClaimSourceError as err:
            log.warning("cannot check the claim holding a device", holder=holder.uid, error=str(err))
            return None
        return released_reason(holder, claim, self._driver_name)

    def _unprepare(self, ref: ClaimRef) -> bool:
        """Release the claim's devices and forget it; False when it is being unprepared right now,
        is gone already, or its devices cannot be released."""
        with self._ledger.claim_lock(ref.uid, timeout=HOLDER_LOCK_SECONDS) as locked:
            current = self._ledger.get(ref.uid)
            if not locked or current is None:
                return False
            try:
                self._release(current)
            except (SharingError, MigError) as err:
                log.warning("cannot release a stale claim's devices", holder=str(ref), error=str(err))
                return False
            self._ledger.forget([ref.uid])
        return True
