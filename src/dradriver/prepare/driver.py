"""The GPU driver behind the DRAPlugin services: prepare and unprepare claims, crash-safely.

Per claim the steps are: fetch (before any lock, as the Go helper does), plan (pure), reserve the
devices as `PrepareStarted` (written to the checkpoint first only when sharing will change a GPU),
apply sharing, write the CDI spec, then `PrepareCompleted` — one checkpoint write for all the
claims of a call, before it answers. A crash at any point leaves a state that `recover` rolls
back or keeps whole at the next start: nothing is half-prepared and no CDI file is orphaned.
Calls for the same claim are serialized, different claims proceed concurrently. With a claim
watch, the claims are prepared from its copies while they are fetched (`_prepare_hinted`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dradriver import logs
from dradriver.devicemodel import PossibleMig
from dradriver.discovery import Gpu, MigDevice
from dradriver.names import dns_label_error, dns_subdomain_error, uid_error
from dradriver.plugin.driver import CallError, ClaimRef, PreparedDevice, PrepareResult
from dradriver.prepare import cdi
from dradriver.prepare.checkpoint import (
    CheckpointData,
    CheckpointError,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
)
from dradriver.prepare.claims import (
    ClaimHints,
    ClaimNotFoundError,
    ClaimSource,
    ClaimSourceError,
    ClaimsUnavailableError,
)
from dradriver.prepare.edits import EditsError, device_edits
from dradriver.prepare.plan import ClaimPlan, Hardware, PlanError, PlannedDevice, Published, plan_claim
from dradriver.prepare.sharing import SharingControl, SharingError
from dradriver.prepare.stale import released_reason

#: Claims of one call are fetched with this many requests in flight.
FETCH_CONCURRENCY = 8
#: How long freeing a stale holder waits for a call already working on that claim.
HOLDER_LOCK_SECONDS = 10.0

log = logs.get_logger(component="prepare")


@dataclass
class Recovery:
    """What start-up found and fixed, for the log and for tests."""

    quarantined: Path | None = None
    rebuilt_from_cdi: list[str] = field(default_factory=list)
    cleared_after_reboot: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    temp_files_removed: int = 0


def claim_ref_error(ref: ClaimRef) -> str | None:
    """Checked before a UID or name goes anywhere near a path or a request."""
    if (err := uid_error(ref.uid)) is not None:
        return f"claim {ref}: invalid UID {ref.uid!r}: {err}"
    if (err := dns_label_error(ref.namespace)) is not None:
        return f"claim {ref}: invalid namespace {ref.namespace!r}: {err}"
    if (err := dns_subdomain_error(ref.name)) is not None:
        return f"claim {ref}: invalid name {ref.name!r}: {err}"
    return None


def overlaps(a: Hardware | None, b: Hardware) -> bool:
    """Whether two devices share silicon: the same device, or a GPU and one of its MIG devices."""
    if a is None:
        return False
    if a.uuid == b.uuid:
        return True
    if isinstance(a, Gpu) and isinstance(b, MigDevice):
        return a.minor == b.parent_minor
    if isinstance(a, MigDevice) and isinstance(b, Gpu):
        return b.minor == a.parent_minor
    return False


class GpuDriver:
    def __init__(
        self,
        *,
        driver_name: str,
        pool_name: str,
        devices: Mapping[str, Published],
        claims: ClaimSource,
        cdi_dir: cdi.CdiDirectory,
        store: CheckpointStore,
        common_edits: cdi.ContainerEdits,
        caps_major: int | None,
        sharing: SharingControl,
        boot_id: str,
        hints: ClaimHints | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.pool_name = pool_name
        self.claims = claims
        self._hints = hints
        self._devices = devices
        self._cdi = cdi_dir
        self._store = store
        self._common = common_edits
        self._caps_major = caps_major
        self._sharing = sharing
        self._boot_id = boot_id
        self._state = CheckpointData(boot_id=boot_id)
        self._state_lock = threading.Lock()
        self._locks_guard = threading.Lock()
        self._claim_locks: dict[str, list[Any]] = {}
        self._fetcher = ThreadPoolExecutor(max_workers=FETCH_CONCURRENCY, thread_name_prefix="fetch-claim")

    # --- start-up -------------------------------------------------------------------------

    def recover(self) -> Recovery:
        """Make the checkpoint and the CDI directory agree again after a restart or a crash."""
        report = Recovery(temp_files_removed=len(self._cdi.remove_temp_files()))
        try:
            loaded = self._store.load()
        except CheckpointError as err:
            report.quarantined = self._store.quarantine()
            log.error(
                "checkpoint unusable: moved aside, rebuilding prepared claims from the CDI directory",
                reason=str(err),
                moved_to=str(report.quarantined),
            )
            loaded = None
        if loaded is None:
            state = self._rebuild_from_cdi()
            report.rebuilt_from_cdi = sorted(state.claims)
        elif loaded.boot_id and self._boot_id and loaded.boot_id != self._boot_id:
            report.cleared_after_reboot = sorted(loaded.claims)
            for uid in loaded.claims:
                self._cdi.remove(uid)
            state = CheckpointData(boot_id=self._boot_id)
        else:
            state = loaded.model_copy(update={"boot_id": self._boot_id})
        for record in [r for r in state.claims.values() if r.state is ClaimState.PREPARE_STARTED]:
            self._undo(record)
            report.rolled_back.append(record.uid)
        claims = {uid: r for uid, r in state.claims.items() if r.state is ClaimState.PREPARE_COMPLETED}
        for uid in self._cdi.claim_uids():
            if uid not in claims:
                self._cdi.remove(uid)
                report.orphans_removed.append(uid)
        with self._state_lock:
            self._state = CheckpointData(boot_id=self._boot_id, claims=claims)
            self._store.save(self._state)
        return report

    def _rebuild_from_cdi(self) -> CheckpointData:
        """Our spec files say which claims are prepared and with which devices; names are lost."""
        claims: dict[str, ClaimRecord] = {}
        for uid in self._cdi.claim_uids():
            spec = self._cdi.read(uid)
            if spec is None or uid_error(uid) is not None:
                continue  # unparseable or not ours after all: removed as an orphan
            records = []
            for entry in spec.get("devices", []):
                qualified = f"{cdi.kind(self.driver_name)}={entry.get('name', '')}"
                device = str(entry.get("name", "")).removeprefix(f"{uid}-")
                hardware = self._hardware_of(device)
                records.append(
                    DeviceRecord(
                        pool=self.pool_name,
                        device=device,
                        cdi_device_ids=(qualified,),
                        uuid=hardware.uuid if hardware else "",
                    )
                )
            claims[uid] = ClaimRecord(
                uid=uid,
                namespace="",
                name="",
                state=ClaimState.PREPARE_COMPLETED,
                devices=tuple(records),
                cdi_file=str(self._cdi.file_for(uid)),
                recovered=True,
            )
        return CheckpointData(boot_id=self._boot_id, claims=claims)

    # --- the Driver interface ---------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        valid = []
        for ref in claims:
            if (problem := claim_ref_error(ref)) is not None:
                results[ref.uid] = PrepareResult(error=problem)
            else:
                valid.append(ref)
        hints = self._cached(valid)
        if hints:
            results.update(self._prepare_hinted(valid, hints))
            return results
        made: list[ClaimRecord] = []
        try:
            for ref, fetched in zip(valid, self._fetch_all(valid), strict=True):
                if isinstance(fetched, str):
                    results[ref.uid] = PrepareResult(error=fetched)
                else:
                    results[ref.uid] = self._prepare_one(ref, fetched, made)
        finally:
            self._persist(made)
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        errors: dict[str, str] = {}
        for ref in claims:
            if (problem := uid_error(ref.uid)) is not None:
                errors[ref.uid] = f"claim {ref}: invalid UID {ref.uid!r}: {problem}"
                continue
            with self._claim_lock(ref.uid):
                record = self._state.claims.get(ref.uid)
                if record is None:
                    errors[ref.uid] = ""  # never prepared here, or already unprepared
                    continue
                try:
                    self._undo(record)
                except SharingError as err:
                    errors[ref.uid] = f"claim {ref}: {err}"
                    continue
                log.info("unprepared", claim=str(ref), uid=ref.uid)
                errors[ref.uid] = ""
        return errors

    def records(self) -> list[ClaimRecord]:
        with self._state_lock:
            return list(self._state.claims.values())

    def close(self) -> None:
        self._fetcher.shutdown(wait=False, cancel_futures=True)

    # --- steps ----------------------------------------------------------------------------

    def _cached(self, refs: Sequence[ClaimRef]) -> dict[str, Mapping[str, Any]]:
        if self._hints is None:
            return {}
        return {ref.uid: claim for ref in refs if (claim := self._hints.get(ref)) is not None}

    def _prepare_hinted(
        self, refs: Sequence[ClaimRef], hints: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, PrepareResult]:
        """Prepare from the watch's copies while the claims are fetched, so the fetch overlaps
        the file writes; answer from a copy only if the fetched claim has the same UID and
        allocation (the kubelet names neither, and a watch may trail a reallocation), else
        prepare what was fetched. A failed fetch fails the call, undoing what it prepared."""
        fetches = [self._fetcher.submit(self._fetch, ref) for ref in refs]
        made: list[ClaimRecord] = []
        try:
            early = {
                uid: self._prepare_copy(ref, hints[uid], made) for ref in refs if (uid := ref.uid) in hints
            }
        finally:
            self._persist(made)
        try:
            fetched = [f.result() for f in fetches]
        except CallError:
            self._discard(made)
            raise
        results = {}
        remade: list[ClaimRecord] = []
        try:
            for ref, claim in zip(refs, fetched, strict=True):
                result = early.get(ref.uid)
                if isinstance(claim, str):
                    results[ref.uid] = PrepareResult(error=claim)
                elif result is not None and _allocation(claim) == _allocation(hints[ref.uid]):
                    results[ref.uid] = result
                else:
                    results[ref.uid] = self._prepare_one(ref, claim, remade)
        finally:
            self._persist(remade)
        return results

    def _persist(self, made: Sequence[ClaimRecord]) -> None:
        """One checkpoint write for the claims a call prepared, before it answers: their spec
        files exist already, and a crash before this write leaves only orphans to remove."""
        if made:
            with self._state_lock:
                self._store.save(self._state)

    def _discard(self, records: Sequence[ClaimRecord]) -> None:
        for record in records:
            with self._claim_lock(record.uid):
                if self._state.claims.get(record.uid) is record:
                    self._undo(record)

    def _fetch_all(self, refs: Sequence[ClaimRef]) -> list[Mapping[str, Any] | str]:
        """Fetch every claim; a claim we cannot see fails the whole call (the Go helper's rules),
        except when there is no claim source at all, which is that claim's error."""
        if len(refs) > 1:
            return list(self._fetcher.map(self._fetch, refs))
        return [self._fetch(r) for r in refs]

    def _fetch(self, ref: ClaimRef) -> Mapping[str, Any] | str:
        try:
            claim = self.claims.get(ref.namespace, ref.name)
        except ClaimsUnavailableError as err:
            return str(err)
        except ClaimSourceError as err:
            raise CallError(f"get resource claims: retrieve claim {ref}: {err}") from err
        if not (claim.get("status") or {}).get("allocation"):
            raise CallError(f"get resource claims: claim {ref} not allocated")
        if (claim.get("metadata") or {}).get("uid") != ref.uid:
            raise CallError(f"get resource claims: claim {ref} got replaced")
        return claim

    def _prepare_one(self, ref: ClaimRef, claim: Mapping[str, Any], made: list[ClaimRecord]) -> PrepareResult:
        result = self._prepare(ref, claim, made, copy=False)
        assert result is not None
        return result

    def _prepare_copy(
        self, ref: ClaimRef, claim: Mapping[str, Any], made: list[ClaimRecord]
    ) -> PrepareResult | None:
        """Prepare from a watch's copy, or None for whatever needs the API server's word: an
        error, a device another claim holds, sharing to apply, an earlier record to replace."""
        return self._prepare(ref, claim, made, copy=True)

    def _prepare(
        self, ref: ClaimRef, claim: Mapping[str, Any], made: list[ClaimRecord], *, copy: bool
    ) -> PrepareResult | None:
        """Prepare `claim` and add its new record to `made`; the caller writes the checkpoint."""
        with self._claim_lock(ref.uid):
            try:
                plan = plan_claim(
                    claim, ref, driver_name=self.driver_name, pool_name=self.pool_name, devices=self._devices
                )
                spec_devices = [self._cdi_device(ref, d) for d in plan.devices]
            except (PlanError, EditsError) as err:
                if copy:
                    return None
                log.warning("cannot prepare claim", claim=str(ref), error=str(err))
                return PrepareResult(error=str(err))
            existing = self._state.claims.get(ref.uid)
            if existing is not None and _same_devices(existing, plan):
                return _result(existing)  # idempotent: the kubelet may ask again
            if copy and (existing is not None or any(d.sharing for d in plan.devices)):
                return None
            if existing is not None:
                if existing.state is ClaimState.PREPARE_COMPLETED and not existing.recovered:
                    log.warning(
                        "claim was prepared for another allocation: preparing it again", claim=str(ref)
                    )
                self._undo(existing, keep_cdi=existing.recovered)
            if not copy:
                self._release_stale_holders(plan)
            started = self._start(plan)
            if isinstance(started, str):
                return None if copy else PrepareResult(error=started)
            try:
                if plan.devices:  # a claim with no devices of ours gets no spec (an empty one is invalid)
                    common = self._common + self._apply_sharing(ref, plan.devices)
                    spec = cdi.render(cdi.ClaimSpec(cdi.kind(self.driver_name), tuple(spec_devices), common))
                    self._cdi.write(ref.uid, spec)
            except (SharingError, cdi.InvalidSpecError, OSError) as err:
                self._undo(started)
                log.warning("prepare failed, rolled back", claim=str(ref), error=str(err))
                return PrepareResult(error=f"claim {ref}: {err}")
            completed = started.model_copy(update={"state": ClaimState.PREPARE_COMPLETED})
            with self._state_lock:
                self._state.claims[ref.uid] = completed
            made.append(completed)
            log.info("prepared", claim=str(ref), uid=ref.uid, devices=[d.name for d in plan.devices])
            return _result(completed)

    def _cdi_device(self, ref: ClaimRef, device: PlannedDevice) -> cdi.CdiDevice:
        return cdi.CdiDevice(
            name=cdi.device_name(ref.uid, _cdi_suffix(device)),
            edits=device_edits(device.name, device.hardware, self._caps_major),
        )

    def _start(self, plan: ClaimPlan) -> ClaimRecord | str:
        """Reserve the devices as PrepareStarted, or explain who holds a device already.

        The record reaches the disk before anything is touched only when sharing will change a
        GPU, which only the checkpoint can tell recovery to undo; a spec file written without it
        is an orphan that recovery removes, so the call's PrepareCompleted write is then the only
        one."""
        ref = plan.claim
        record = ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=tuple(
                DeviceRecord(
                    pool=d.pool,
                    device=d.name,
                    request_names=d.requests,
                    cdi_device_ids=(cdi.qualified_device_id(self.driver_name, ref.uid, _cdi_suffix(d)),),
                    admin_access=d.admin_access,
                    share_id=d.share_id,
                    uuid=d.uuid,
                    sharing=d.sharing.describe() if d.sharing else "",
                )
                for d in plan.devices
            ),
            cdi_file=str(self._cdi.file_for(ref.uid)) if plan.devices else "",
        )
        with self._state_lock:
            for device in plan.devices:
                holder = self._conflict(ref.uid, device)
                if holder is not None:
                    return (
                        f"claim {ref}: device {device.name} is already prepared for claim "
                        f"{holder.namespace}/{holder.name} ({holder.uid}) and cannot be shared"
                    )
            self._state.claims[ref.uid] = record
            if any(d.sharing for d in plan.devices):
                self._store.save(self._state)
        return record

    def _release_stale_holders(self, plan: ClaimPlan) -> None:
        """Unprepare claims that hold a device of `plan` but whose ResourceClaim says they cannot
        be using it any more (deleted, deallocated, reserved for no pod).

        After a pod holding a GPU is force-deleted, the scheduler may give that GPU to a new pod
        before the kubelet has unprepared the old claim; refusing the new claim would leave its
        pod waiting for the kubelet's next resync (a minute or more). The API server is the
        authority here; without one (files, node-only mode) nothing is released.
        """
        if not self.claims.authoritative:
            return
        with self._state_lock:
            holders = {
                h.uid: h
                for d in plan.devices
                if (h := self._conflict(plan.claim.uid, d)) is not None
                and h.state is ClaimState.PREPARE_COMPLETED
                and h.name
            }
        for holder in holders.values():
            try:
                claim: Mapping[str, Any] | None = self.claims.get(holder.namespace, holder.name)
            except ClaimNotFoundError:
                claim = None
            except ClaimSourceError as err:
                log.warning("cannot check the claim holding a device", holder=holder.uid, error=str(err))
                continue
            reason = released_reason(holder, claim, self.driver_name)
            if reason is None:
                continue
            ref = ClaimRef(holder.namespace, holder.name, holder.uid)
            with self._claim_lock(holder.uid, timeout=HOLDER_LOCK_SECONDS) as locked:
                current = self._state.claims.get(holder.uid)
                if not locked or current is None:
                    continue  # being unprepared right now, or gone already
                try:
                    self._undo(current)
                except SharingError as err:
                    log.warning("cannot release a stale claim's sharing", holder=str(ref), error=str(err))
                    continue
            log.info(
                "unprepared a claim that no longer uses its devices, for the claim they were allocated to",
                claim=str(ref),
                uid=holder.uid,
                reason=reason,
                for_claim=str(plan.claim),
            )

    def _conflict(self, uid: str, device: PlannedDevice) -> ClaimRecord | None:
        if device.admin_access:
            return None
        for other in self._state.claims.values():
            if other.uid == uid:
                continue
            for held in other.devices:
                if held.admin_access or (device.share_id is not None and held.share_id is not None):
                    continue
                if held.device == device.name or overlaps(self._hardware_of(held.device), device.hardware):
                    return other
        return None

    def _hardware_of(self, name: str) -> Hardware | None:
        published = self._devices.get(name)
        return published.existing if isinstance(published, PossibleMig) else published

    def _apply_sharing(self, ref: ClaimRef, devices: Sequence[PlannedDevice]) -> cdi.ContainerEdits:
        edits = cdi.ContainerEdits()
        groups: dict[str, list[PlannedDevice]] = {}
        for device in devices:
            if device.sharing is not None:
                groups.setdefault(device.sharing.model_dump_json(), []).append(device)
        for group in groups.values():
            sharing = group[0].sharing
            assert sharing is not None
            edits = edits + self._sharing.apply(ref.uid, sharing, group)
        return edits

    def _undo(self, record: ClaimRecord, *, keep_cdi: bool = False) -> None:
        """Release sharing, remove the spec, forget the claim; safe to repeat after a crash."""
        by_sharing: dict[str, list[str]] = {}
        for device in record.devices:
            if device.sharing:
                by_sharing.setdefault(device.sharing, []).append(device.uuid)
        for description, uuids in by_sharing.items():
            self._sharing.release(record.uid, description, uuids)
        if not keep_cdi:
            self._cdi.remove(record.uid)
        with self._state_lock:
            if self._state.claims.pop(record.uid, None) is not None:
                self._store.save(self._state)

    @contextmanager
    def _claim_lock(self, uid: str, timeout: float = -1) -> Iterator[bool]:
        """Serialize work on one claim; yields whether the lock was taken (always, without timeout)."""
        with self._locks_guard:
            entry = self._claim_locks.setdefault(uid, [threading.Lock(), 0])
            entry[1] += 1
        lock: threading.Lock = entry[0]
        locked = lock.acquire(timeout=timeout)
        try:
            yield locked
        finally:
            if locked:
                lock.release()
            with self._locks_guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._claim_locks[uid]


def _allocation(claim: Mapping[str, Any]) -> Any:
    return (claim.get("status") or {}).get("allocation")


def _same_devices(record: ClaimRecord, plan: ClaimPlan) -> bool:
    """Whether `record` is a finished preparation of the devices `plan` names: the same
    allocation (a claim deallocated and allocated again may get other devices)."""
    return (
        record.state is ClaimState.PREPARE_COMPLETED
        and not record.recovered
        and sorted((d.pool, d.device, d.share_id or "") for d in record.devices)
        == sorted((d.pool, d.name, d.share_id or "") for d in plan.devices)
    )


def _cdi_suffix(device: PlannedDevice) -> str:
    return device.name if device.share_id is None else f"{device.name}-{device.share_id[:8]}"


def _result(record: ClaimRecord) -> PrepareResult:
    return PrepareResult(
        devices=tuple(
            PreparedDevice(
                pool_name=d.pool,
                device_name=d.device,
                request_names=d.request_names,
                cdi_device_ids=d.cdi_device_ids,
                share_id=d.share_id,
            )
            for d in record.devices
        )
    )
