"""Claims prepared here that no longer need their devices: freed when a prepare needs their
devices (`StaleHolders`), or collected once deleted (`StaleClaimCollector`). Both unprepare them
the way the kubelet would (`prepare.unprepare`).

Stale holders: after a pod holding a GPU is force-deleted, the scheduler may give that GPU to a new
pod before the kubelet has unprepared the old claim; refusing the new claim would leave its pod
waiting for the kubelet's next resync (a minute or more). The API server is the authority here
(`released_reason`); without one (files, node-only mode) nothing is released.

Deleted claims: the kubelet unprepares a claim when its last pod on the node goes, but not
always: a force-deleted pod, a lost kubelet checkpoint or a node that was down while the claim was
deleted leave claims prepared forever (NVIDIA's driver leaks them:
kubernetes-sigs/dra-driver-nvidia-gpu#1278). A claim counts as gone when the API server answers
NotFound for its namespace/name, or returns an object with another UID. Only after it has been
seen gone for `grace` seconds is it unprepared; an API server that cannot be reached is never
taken as an answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from dradriver import logs
from dradriver.devicemodel import Hardware
from dradriver.periodic import Periodic
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import ClaimRecord, ClaimState
from dradriver.prepare.claims import ClaimNotFoundError, ClaimSource, ClaimSourceError
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.plan import ClaimPlan
from dradriver.prepare.unprepare import Unpreparer

DEFAULT_GRACE_SECONDS = 300.0
#: How often at most the API server is asked, whatever the grace period.
MAX_INTERVAL_SECONDS = 60.0

log = logs.get_logger(component="stale-claims")


def gone_reason(record: ClaimRecord, claim: Mapping[str, Any] | None) -> str | None:
    """Why `record`'s ResourceClaim no longer exists (`claim` None: the API server said NotFound)."""
    if claim is None:
        return "its ResourceClaim is gone"
    if (claim.get("metadata") or {}).get("uid") != record.uid:
        return "its ResourceClaim was deleted and created again with another UID"
    return None


def released_reason(record: ClaimRecord, claim: Mapping[str, Any] | None, driver_name: str) -> str | None:
    """Why `record`'s claim cannot be using its devices any more, or None if it may still be.

    Asked when the scheduler has given one of those devices to another claim: it only does that
    once this claim is deallocated, which follows its last pod going (reservedFor emptied). The
    kubelet unprepares such a claim a moment later; it must not block the next claim meanwhile.
    """
    if (gone := gone_reason(record, claim)) is not None:
        return gone
    assert claim is not None
    status = claim.get("status") or {}
    if not status.get("allocation"):
        return "its ResourceClaim is no longer allocated"
    if not status.get("reservedFor"):
        return "its ResourceClaim is reserved for no pod any more"
    results = (status["allocation"].get("devices") or {}).get("results") or []
    allocated = {(r.get("pool"), r.get("device")) for r in results if r.get("driver") == driver_name}
    if record.devices and not any((d.pool, d.device) in allocated for d in record.devices):
        return "its ResourceClaim was allocated other devices since"
    return None


def _fetch(source: ClaimSource, record: ClaimRecord) -> Mapping[str, Any] | None:
    """The record's ResourceClaim (None: NotFound). Raises ClaimSourceError when there is no answer."""
    try:
        return source.get(record.namespace, record.name)
    except ClaimNotFoundError:
        return None


class StaleHolders:
    """Run inside a prepare call (which the driver serializes with every other)."""

    def __init__(self, source: ClaimSource, ledger: Ledger, unpreparer: Unpreparer, driver_name: str) -> None:
        self._source = source
        self._ledger = ledger
        self._unpreparer = unpreparer
        self._driver_name = driver_name

    def free(self, planned: Sequence[ClaimPlan], devices: Mapping[str, Hardware]) -> None:
        """Unprepare the claims that hold a device of the plans but whose ResourceClaim says they
        cannot be using it any more (deleted, deallocated, reserved for no pod)."""
        if not self._source.authoritative or not planned:
            return
        released: set[str] = set()
        for (uid, for_claim), holder in self._ledger.stale_candidates(planned, devices).items():
            if uid in released:
                continue
            try:
                reason = released_reason(holder, _fetch(self._source, holder), self._driver_name)
            except ClaimSourceError as err:
                log.warning("cannot check the claim holding a device", holder=holder.uid, error=str(err))
                continue
            if reason is None:
                continue
            ref = ClaimRef(holder.namespace, holder.name, holder.uid)
            if error := self._unpreparer.run([ref])[uid]:
                log.warning("cannot unprepare a stale claim", holder=str(ref), error=error)
                continue
            released.add(uid)
            log.info(
                "unprepared a claim that no longer uses its devices, for the claim they were allocated to",
                claim=str(ref),
                uid=uid,
                reason=reason,
                for_claim=str(for_claim),
            )


class PreparedClaims(Protocol):
    def records(self) -> list[ClaimRecord]: ...

    def unprepare(self, claims: list[ClaimRef]) -> object: ...


class StaleClaimCollector:
    def __init__(
        self,
        driver: PreparedClaims,
        source: ClaimSource,
        *,
        grace: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._driver = driver
        self._source = source
        self.grace = grace
        self._clock = clock
        self._gone_since: dict[str, float] = {}
        self._loop = Periodic(
            step=self.check_once,
            interval=min(MAX_INTERVAL_SECONDS, max(grace / 2, 0.1)),
            name="stale-claims",
            failed="stale claim check failed; trying again later",
            log=log,
        )

    def check_once(self) -> list[str]:
        """One pass; returns the UIDs of the claims it unprepared."""
        now = self._clock()
        candidates = [
            r
            for r in self._driver.records()
            if r.state is ClaimState.PREPARE_COMPLETED and r.name and not r.recovered
        ]
        unprepared = []
        for record in candidates:
            gone = self._gone(record)
            if gone is None:
                continue  # no answer: do not guess
            if not gone:
                self._gone_since.pop(record.uid, None)
                continue
            since = self._gone_since.setdefault(record.uid, now)
            if now - since >= self.grace:
                ref = ClaimRef(record.namespace, record.name, record.uid)
                log.warning(
                    "ResourceClaim is gone from the API server: unpreparing it",
                    claim=str(ref),
                    uid=record.uid,
                    gone_for_seconds=round(now - since, 1),
                )
                self._driver.unprepare([ref])
                self._gone_since.pop(record.uid, None)
                unprepared.append(record.uid)
        known = {r.uid for r in candidates}
        self._gone_since = {uid: t for uid, t in self._gone_since.items() if uid in known}
        return unprepared

    def _gone(self, record: ClaimRecord) -> bool | None:
        try:
            claim = _fetch(self._source, record)
        except ClaimSourceError as err:
            log.debug("cannot check claim", claim=f"{record.namespace}/{record.name}", error=str(err))
            return None
        return gone_reason(record, claim) is not None

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
