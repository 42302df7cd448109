"""The GPU driver behind the DRAPlugin services: prepare and unprepare claims, crash-safely.

The claims of one call go through the steps together: fetch (before any lock, as the Go helper
does), plan (pure), reserve the devices of all of them as `PrepareStarted`, create the MIG devices
of allocated MIG placements (each step recorded first), apply sharing and write each CDI spec,
then record `PrepareCompleted` for all in one checkpoint write before the call answers. The
reservations reach the disk first (one more write) only when something a spec file cannot tell
recovery about is changed: sharing applied to a GPU, a MIG device made, an earlier record
replaced; otherwise a crash leaves spec files without records, orphans that recovery removes.
So a call costs O(claims) and one or two checkpoint writes, however many claims it carries, plus
two per MIG device made. Unprepare undoes the steps in reverse. A crash at any point leaves a
state that `recover` rolls back or keeps whole at the next start: nothing is half-prepared, no
CDI file is orphaned and no MIG device we made is left without a claim. The checkpoint write is
the commit point: when it fails (a full, read-only or failing disk) the call undoes what it set
up and fails its claims, so memory and disk stay as the checkpoint says and the kubelet's retry
does the work again; unprepare sets specs aside until the write succeeds. A repeated prepare
checks each claim's spec against the one recorded and rewrites it if it differs. Calls for the same
claim are serialized, different claims proceed concurrently (MIG reconfiguration is serialized
by the `MigManager`).

With rolling updates two instances share the node's checkpoint: every prepare and unprepare
(after the claims are fetched) then holds `serialize.lock` across instances and starts from the
checkpoint as the other instance may have left it (see `prepare.shared`).

Every claim is fetched from the API server before anything is prepared for it (one GET each, as
the Go helper does): nothing cluster-wide is listed or watched, so what a node costs the API
server does not grow with the cluster, and no allocation is acted on unconfirmed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dradriver import logs
from dradriver.devicemodel import PossibleMig
from dradriver.discovery import Gpu, MigDevice
from dradriver.files.write import StorageError, storage_error
from dradriver.mig import MigError
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
    MigRecord,
)
from dradriver.prepare.claims import (
    ClaimNotFoundError,
    ClaimSource,
    ClaimSourceError,
    ClaimUnusableError,
)
from dradriver.prepare.devnodes import HostDeviceNodes
from dradriver.prepare.edits import EditsError, check_mig_access, device_edits
from dradriver.prepare.mig import MigManager, intent
from dradriver.prepare.mps_shares import ShareDaemons
from dradriver.prepare.plan import ClaimPlan, PlanError, PlannedDevice, Published, plan_claim
from dradriver.prepare.resourceclaim import ClaimFormatError, ResourceClaim, decode_claim
from dradriver.prepare.shared import SerializeLock
from dradriver.prepare.sharing import SharingControl, SharingError
from dradriver.prepare.stale import released_reason

#: Claims of one call are fetched with this many requests in flight.
FETCH_CONCURRENCY = 8

#: Calls with more claims than this log one "prepared claims" line instead of one per claim
#: (each still at debug level): a 3,000-claim call would otherwise spend a second logging.
LOG_EACH_CLAIM_UP_TO = 100

#: How long freeing a stale holder waits for a call already working on that claim.
HOLDER_LOCK_SECONDS = 10.0

#: Prepared devices by the GPU they are on (see GpuDriver._holders).
_Holders = dict[str, list[tuple[ClaimRecord, DeviceRecord]]]

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
    temp_files_removed: int = 0


@dataclass
class _Batch:
    """What `GpuDriver._prepare_batch` did."""

    results: dict[str, PrepareResult] = field(default_factory=dict)
    #: The records of the claims it prepared (not those it found prepared already).
    prepared: list[ClaimRecord] = field(default_factory=list)
    #: Whether the checkpoint must be written before the call answers.
    write: bool = False


def claim_ref_error(ref: ClaimRef) -> str | None:
    """Checked before a UID or name goes anywhere near a path or a request."""
    if (err := uid_error(ref.uid)) is not None:
        return f"claim {ref}: invalid UID {ref.uid!r}: {err}"
    if (err := dns_label_error(ref.namespace)) is not None:
        return f"claim {ref}: invalid namespace {ref.namespace!r}: {err}"
    if (err := dns_subdomain_error(ref.name)) is not None:
        return f"claim {ref}: invalid name {ref.name!r}: {err}"
    return None


def _silicon(device: Published) -> tuple[int, range | None]:
    """The GPU minor a device lives on and the memory slices it takes (None: all of them)."""
    if isinstance(device, Gpu):
        return device.minor, None
    spot = device.placement
    minor = device.parent_minor if isinstance(device, MigDevice) else device.parent.minor
    return minor, range(spot.start, spot.start + spot.size)


def overlaps(a: Published | None, b: Published) -> bool:
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
        mig: MigManager,
        serialize: SerializeLock | None = None,
        host_nodes: HostDeviceNodes | None = None,
        shares: ShareDaemons | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.pool_name = pool_name
        self.claims = claims
        self._devices = devices
        self._cdi = cdi_dir
        self._store = store
        self._common = common_edits
        self._caps_major = caps_major
        #: None with fake GPUs: their nodes are no host's.
        self._host_nodes = host_nodes
        self._sharing = sharing
        self._shares = shares or ShareDaemons()
        self._mig = mig
        self._boot_id = boot_id
        self._state = CheckpointData(boot_id=boot_id)
        self._state_lock = threading.Lock()
        self._locks_guard = threading.Lock()
        self._claim_locks_by_uid: dict[str, list[Any]] = {}
        self._fetcher = ThreadPoolExecutor(max_workers=FETCH_CONCURRENCY, thread_name_prefix="fetch-claim")
        self._serialize = serialize
        #: Called after an unprepare released devices (the live inventory drops vanished ones).
        self.on_released: Callable[[], None] = lambda: None

    def set_devices(
        self, devices: Mapping[str, Published], *, common_edits: cdi.ContainerEdits, caps_major: int | None
    ) -> None:
        """The node's devices changed (live inventory, a host driver upgrade): later claims are
        planned and their specs written on these."""
        self._devices = devices
        self._common = common_edits
        self._caps_major = caps_major

    def held_devices(self) -> set[str]:
        """Names of the devices prepared claims hold (or are being prepared with)."""
        with self._state_lock:
            return {d.device for r in self._state.claims.values() for d in r.devices}

    def mig_settled(self) -> contextlib.AbstractContextManager[None]:
        """While it is held, no MIG device is being made or removed (a rescan of the node)."""
        return self._mig.settled()

    # --- start-up -------------------------------------------------------------------------

    def recover(self) -> Recovery:
        """Make the checkpoint and the CDI directory agree again after a restart or a crash.

        With rolling updates the other instance may be mid-prepare: the lock waits for it."""
        with self._exclusive():
            return self._recover()

    def _recover(self) -> Recovery:
        # A full or read-only disk fails start-up here, before a spec or a record is touched.
        self._store.check_writable()
        self._cdi.check_writable()
        report = Recovery(temp_files_removed=len(self._cdi.remove_temp_files()))
        last_boot = self._store.last_boot()
        try:
            loaded = self._store.load()
        except CheckpointError as err:
            report.quarantined = self._store.quarantine()
            if self._before_this_boot(last_boot):  # expected after a power failure
                log.warning(
                    "checkpoint of a previous boot unusable: moved aside (its claims are void now)",
                    error=str(err),
                    moved_to=str(report.quarantined),
                )
            else:
                log.error(
                    "checkpoint unusable: moved aside, rebuilding prepared claims from the CDI directory",
                    error=str(err),
                    moved_to=str(report.quarantined),
                )
            loaded = None
        # The boot of what is on disk: the checkpoint's, or with none readable the marker's (saves
        # are not fsynced, so a power failure may cost the checkpoint; the specs are that boot's).
        if self._before_this_boot(loaded.boot_id if loaded is not None else last_boot):
            report.cleared_after_reboot = sorted(self._cdi.claim_uids() if loaded is None else loaded.claims)
            for uid in report.cleared_after_reboot:
                self._cdi.remove(uid)
            state = CheckpointData(boot_id=self._boot_id)
        elif loaded is None:
            state = self._rebuild_from_cdi()
            report.rebuilt_from_cdi = sorted(state.claims)
        else:
            state = loaded.model_copy(update={"boot_id": self._boot_id})
        claims = {uid: r for uid, r in state.claims.items() if r.state is ClaimState.PREPARE_COMPLETED}
        self._shares.reset(state.claims.values())
        for record in [r for r in state.claims.values() if r.state is ClaimState.PREPARE_STARTED]:
            try:
                self._release(record)
            except MigError as err:
                log.error(
                    "could not roll back a half-prepared claim: its MIG device stays recorded",
                    uid=record.uid,
                    error=str(err),
                )
                claims[record.uid] = record
                report.rollback_failed.append(record.uid)
                continue
            report.rolled_back.append(record.uid)
        for uid in self._cdi.claim_uids():
            if uid not in claims or claims[uid].state is not ClaimState.PREPARE_COMPLETED:
                self._cdi.remove(uid)
                report.orphans_removed.append(uid)
        report.specs_rewritten, failed = self._restore_specs(list(claims.values()))
        for uid, error in failed.items():
            log.error("a prepared claim's CDI spec cannot be rewritten", uid=uid, error=error)
        with self._state_lock:
            # A model_copy keeps the fields a newer version wrote at the top level.
            self._state = state.model_copy(update={"boot_id": self._boot_id, "claims": claims})
            if self._boot_id and last_boot != self._boot_id:
                self._store.mark_boot(self._boot_id)  # once the previous boot's specs are gone
            self._store.save(self._state)
        self._shares.recover()
        return report

    def _restore_specs(self, records: Sequence[ClaimRecord]) -> tuple[list[str], dict[str, str]]:
        """Rewrite (atomically) the spec of each prepared claim whose file is missing or differs
        from what was written (deleted, emptied, overwritten): the UIDs rewritten, and the error
        of each that cannot be. A record of an older version, which kept no spec, is not checked."""
        stale = {
            r.uid: r.cdi_spec
            for r in records
            if r.cdi_spec is not None
            and r.state is ClaimState.PREPARE_COMPLETED
            and self._cdi.read(r.uid) != r.cdi_spec
        }
        if not stale:
            return [], {}
        log.warning("CDI specs of prepared claims were missing or changed: rewriting", claims=sorted(stale))
        errors = {
            uid: "its CDI spec was missing or changed and "
            + str(storage_error("rewrite it", self._cdi.path, err) if isinstance(err, OSError) else err)
            for uid, err in self._cdi.write_many(stale).items()
        }
        return sorted(stale.keys() - errors.keys()), errors

    def _before_this_boot(self, boot_id: str | None) -> bool:
        return bool(boot_id and self._boot_id and boot_id != self._boot_id)

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
                        uuid=hardware.uuid if isinstance(hardware, Gpu | MigDevice) else "",
                    )
                )
            claims[uid] = ClaimRecord(
                uid=uid,
                namespace="",
                name="",
                state=ClaimState.PREPARE_COMPLETED,
                devices=tuple(records),
                cdi_file=str(self._cdi.file_for(uid)),
                cdi_spec=spec,
                recovered=True,
            )
        return CheckpointData(boot_id=self._boot_id, claims=claims)

    # --- the Driver interface ---------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        valid: dict[str, ClaimRef] = {}
        for ref in claims:
            if (problem := claim_ref_error(ref)) is not None:
                results[ref.uid] = PrepareResult(error=problem)
            else:
                valid.setdefault(ref.uid, ref)  # a UID twice in one call is prepared once
        fetched: list[tuple[ClaimRef, ResourceClaim]] = []
        for ref, claim in zip(valid.values(), self._fetch_all(list(valid.values())), strict=True):
            if isinstance(claim, str):
                results[ref.uid] = PrepareResult(error=claim)
            else:
                fetched.append((ref, claim))
        batch = _Batch()
        with self._exclusive(), self._claim_locks([ref.uid for ref, _ in fetched]):
            with self._state_lock:
                before = dict(self._state.claims)
            try:
                self._prepare_batch(fetched, batch)
                if batch.write:
                    self._persist()
            except StorageError as err:
                self._undo_call(before, fetched, batch, err)
            else:
                self._log_prepared(batch.prepared)
        results.update(batch.results)
        return results

    def _undo_call(
        self,
        before: dict[str, ClaimRecord],
        fetched: Sequence[tuple[ClaimRef, ResourceClaim]],
        batch: _Batch,
        error: StorageError,
    ) -> None:
        """The checkpoint write of a prepare failed: undo what the call set up (sharing, MIG
        devices, specs), so that memory and disk are as the checkpoint says, and fail each claim
        it would have prepared; the kubelet's retry does the work again."""
        with self._state_lock:
            current = dict(self._state.claims)
            touched = {u for u in current.keys() | before.keys() if current.get(u) is not before.get(u)}
            self._state.claims.clear()
            self._state.claims.update(before)
        for uid in touched:
            if (record := current.get(uid)) is not None:
                try:
                    self._release(record)
                except (SharingError, MigError, OSError) as undo_error:
                    log.error("could not undo an unrecorded prepare", uid=uid, error=str(undo_error))
        for ref, _ in fetched:
            result = batch.results.get(ref.uid)
            if result is None or (ref.uid in touched and not result.error):
                batch.results[ref.uid] = PrepareResult(error=f"claim {ref}: not prepared: {error}")
        log.error("prepare not recorded: undone", claims=len(touched), error=str(error))

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        with self._exclusive():
            errors = self._unprepare(claims)
        self.on_released()
        return errors

    def _unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        errors: dict[str, str] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            if (problem := uid_error(ref.uid)) is not None:
                errors[ref.uid] = f"claim {ref}: invalid UID {ref.uid!r}: {problem}"
            else:
                refs.setdefault(ref.uid, ref)
        with self._claim_locks(list(refs)):
            released: dict[str, Path | None] = {}  # the spec of each, set aside until the write
            for uid, ref in refs.items():
                record = self._state.claims.get(uid)
                errors[uid] = ""  # never prepared here, or already unprepared: success
                if record is None:
                    continue
                try:
                    aside = self._cdi.set_aside(uid)
                except StorageError as err:  # nothing undone yet: the claim stays whole
                    errors[uid] = f"claim {ref}: {err}"
                    continue
                try:
                    self._release(record, keep_cdi=True)
                except (SharingError, MigError) as err:
                    if aside is not None:
                        self._cdi.put_back(uid, aside)
                    errors[uid] = f"claim {ref}: {err}"
                    continue
                released[uid] = aside
            try:
                self._forget(list(released))
            except StorageError as err:  # still prepared: the specs go back, the kubelet retries
                for uid, aside in released.items():
                    if aside is not None:
                        self._cdi.put_back(uid, aside)
                    errors[uid] = f"claim {refs[uid]}: not unprepared: {err}"
                return errors
            for uid, aside in released.items():
                if aside is not None:
                    aside.unlink(missing_ok=True)
                log.info("unprepared", claim=str(refs[uid]), uid=uid)
        return errors

    def records(self) -> list[ClaimRecord]:
        with self._state_lock:
            return list(self._state.claims.values())

    def created_instances(self) -> dict[tuple[str, int], str]:
        """(GPU UUID, GPU instance id) -> placement device, for each MIG device made for a claim."""
        with self._state_lock:
            return self._state.created_gpu_instances()

    def close(self) -> None:
        self._fetcher.shutdown(wait=False, cancel_futures=True)
        self._mig.close()

    # --- steps ----------------------------------------------------------------------------

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Rolling updates: one call at a time across instances, on the checkpoint as last written."""
        if self._serialize is None:
            yield
            return
        with self._serialize:
            self._reload_if_changed()
            yield

    def _reload_if_changed(self) -> None:
        if not self._store.changed_on_disk():
            return
        try:
            loaded = self._store.load()
        except CheckpointError as err:
            # Ours stays; the next save replaces the bad file with it.
            log.error("the checkpoint another instance wrote cannot be read", reason=str(err))
            return
        with self._state_lock:
            self._state = (
                loaded.model_copy(update={"claims": dict(loaded.claims)})
                if loaded is not None
                else CheckpointData(boot_id=self._boot_id)
            )
            self._shares.reset(self._state.claims.values())
        log.debug("checkpoint reloaded: another instance changed it", claims=len(self._state.claims))

    def _persist(self) -> None:
        """A checkpoint write before the call answers: the spec files of the claims it prepared
        exist already, and a crash before this write leaves only orphans to remove."""
        with self._state_lock:
            self._store.save(self._state)

    def _fetch_all(self, refs: Sequence[ClaimRef]) -> list[ResourceClaim | str]:
        """Fetch every claim; a claim we cannot see fails the whole call (the Go helper's rules),
        while a claim that cannot be used (no claim source, a malformed object, an unreadable
        claim file) is that claim's error."""
        if (
            len(refs) > 1 and self.claims.remote
        ):  # requests in flight together; local reads are cheaper in turn
            return list(self._fetcher.map(self._fetch, refs))
        return [self._fetch(r) for r in refs]

    def _fetch(self, ref: ClaimRef) -> ResourceClaim | str:
        try:
            raw = self.claims.get(ref.namespace, ref.name)
        except ClaimUnusableError as err:
            return str(err)
        except ClaimSourceError as err:
            raise CallError(f"get resource claims: retrieve claim {ref}: {err}") from err
        try:
            claim = decode_claim(raw)
        except ClaimFormatError as err:
            return f"claim {ref}: {err}"
        if claim.status.allocation is None:
            raise CallError(f"get resource claims: claim {ref} not allocated")
        if claim.metadata.uid != ref.uid:
            raise CallError(f"get resource claims: claim {ref} got replaced")
        return claim

    def _prepare_batch(self, claims: Sequence[tuple[ClaimRef, ResourceClaim]], batch: _Batch) -> None:
        """Prepare claims whose locks are held: plan all, reserve all, make their MIG devices,
        write specs and record all completed in memory, filling `batch`; the caller writes the
        checkpoint once, before answering, if the batch says so."""
        results = batch.results
        replaced: list[str] = []
        planned: list[ClaimPlan] = []
        again: dict[ClaimRef, ClaimRecord] = {}
        for ref, claim in claims:
            existing = self._state.claims.get(ref.uid)
            if existing is not None and _same_devices(existing, claim, self.driver_name):
                results[ref.uid] = _result(existing)  # idempotent: the kubelet may ask again
                again[ref] = existing
                continue
            if existing is not None:
                if existing.state is ClaimState.PREPARE_COMPLETED and not existing.recovered:
                    log.warning(
                        "claim was prepared for another allocation: preparing it again", claim=str(ref)
                    )
                try:
                    self._release(existing, keep_cdi=existing.recovered)
                except (SharingError, MigError) as err:
                    results[ref.uid] = PrepareResult(
                        error=f"claim {ref}: cannot undo an earlier attempt: {err}"
                    )
                    continue
                replaced.append(ref.uid)
            try:
                plan = plan_claim(
                    claim, ref, driver_name=self.driver_name, pool_name=self.pool_name, devices=self._devices
                )
                for device in plan.devices:  # what can be checked before anything is touched
                    if isinstance(device.hardware, PossibleMig):
                        check_mig_access(device.name, self._caps_major)
                    else:
                        self._cdi_device(ref, device)
            except (PlanError, EditsError) as err:
                log.warning("cannot prepare claim", claim=str(ref), error=str(err))
                results[ref.uid] = PrepareResult(error=str(err))
                continue
            planned.append(plan)
        _, failed_rewrites = self._restore_specs(list(again.values()))
        for ref in again:
            if (rewrite_error := failed_rewrites.get(ref.uid)) is not None:
                results[ref.uid] = PrepareResult(error=f"claim {ref}: {rewrite_error}")
        self._release_stale_holders(planned)
        started = self._start(planned, replaced, results)
        completed: list[ClaimRecord] = []
        failed: list[ClaimRecord] = []
        specs: dict[str, dict[str, Any]] = {}
        for plan in started:
            ref = plan.claim
            if not plan.devices:  # a claim with no devices of ours gets no spec (an empty one is invalid)
                continue
            try:
                devices = self._create_mig_devices(ref.uid, plan.devices)
                with self._state_lock:
                    self._state.claims[ref.uid] = _with_created_migs(self._state.claims[ref.uid], devices)
                spec_devices = self._shares.prepare(
                    ref.uid, devices, [self._cdi_device(ref, d) for d in devices]
                )
                common = self._common + self._apply_sharing(ref, devices)
                if self._host_nodes is not None:
                    common = self._host_nodes.complete(common, (d.edits for d in spec_devices))
            except (SharingError, MigError, EditsError) as err:
                self._fail(ref.uid, err, failed, results)
                continue
            specs[ref.uid] = cdi.render(cdi.ClaimSpec(cdi.kind(self.driver_name), spec_devices, common))
        written = self._cdi.write_many(specs)
        rolled_back = {record.uid for record in failed}
        for plan in started:
            uid = plan.claim.uid
            if uid in rolled_back or uid in results:
                continue
            if (error := written.get(uid)) is not None:
                problem = (
                    storage_error("write the CDI spec", self._cdi.path, error)
                    if isinstance(error, OSError)
                    else error
                )
                self._fail(uid, problem, failed, results)
            else:
                completed.append(
                    self._state.claims[uid].model_copy(
                        update={"state": ClaimState.PREPARE_COMPLETED, "cdi_spec": specs.get(uid)}
                    )
                )
        with self._state_lock:
            for record in failed:
                self._state.claims.pop(record.uid, None)
            for record in completed:
                self._state.claims[record.uid] = record
        for record in completed:
            results[record.uid] = _result(record)
        batch.prepared = completed
        batch.write = bool(started or replaced)

    def _log_prepared(self, completed: Sequence[ClaimRecord]) -> None:
        """One line per claim, unless a call carries so many that one line for all says more."""
        each = log.info if len(completed) <= LOG_EACH_CLAIM_UP_TO else log.debug
        for record in completed:
            each(
                "prepared",
                claim=f"{record.namespace}/{record.name}",
                uid=record.uid,
                devices=[d.device for d in record.devices],
            )
        if len(completed) > LOG_EACH_CLAIM_UP_TO:
            log.info(
                "prepared claims", count=len(completed), claims=[f"{r.namespace}/{r.name}" for r in completed]
            )

    def _fail(
        self,
        uid: str,
        error: Exception,
        failed: list[ClaimRecord],
        results: dict[str, PrepareResult],
    ) -> None:
        """Roll a started claim back (its record is forgotten with the call's checkpoint write); what
        cannot be undone yet (a MIG device NVML will not destroy) stays recorded for recovery."""
        record = self._state.claims[uid]
        ref = ClaimRef(record.namespace, record.name, record.uid)
        try:
            self._release(record)
            failed.append(record)
        except (SharingError, MigError) as undo_error:
            log.error("prepare failed and could not be rolled back", claim=str(ref), error=str(undo_error))
        except OSError as undo_error:  # a spec file no record names: recovery removes it
            failed.append(record)
            log.error("prepare failed, its spec not removed", claim=str(ref), error=str(undo_error))
        log.warning("prepare failed, rolled back", claim=str(ref), error=str(error))
        if isinstance(error, MigError) and error.reason == "insufficient_resources":
            message = (
                f"claim {ref}: cannot create the MIG device: {error} (the GPU has no room at the allocated "
                "placement: a MIG device made outside dradriver may overlap it)"
            )
        else:
            message = f"claim {ref}: {error}"
        results[uid] = PrepareResult(error=message)

    def _create_mig_devices(self, uid: str, devices: Sequence[PlannedDevice]) -> list[PlannedDevice]:
        """The planned devices with each MIG placement replaced by the MIG device made for it."""
        created = []
        for device in devices:
            placement = device.hardware
            if not isinstance(placement, PossibleMig):
                created.append(device)
                continue

            def record(step: MigRecord, name: str = device.name) -> None:
                self._record_mig(uid, name, step)

            created.append(replace(device, hardware=self._mig.create(placement, record)))
        return created

    def _record_mig(self, uid: str, device: str, step: MigRecord) -> None:
        """Save a MIG creation step in the claim's record."""
        with self._state_lock:
            record = self._state.claims[uid]
            devices = tuple(
                d.model_copy(update={"mig": step}) if d.device == device else d for d in record.devices
            )
            self._state.claims[uid] = record.model_copy(update={"devices": devices})
            self._store.save(self._state)

    def _cdi_device(self, ref: ClaimRef, device: PlannedDevice) -> cdi.CdiDevice:
        hardware = device.hardware
        if isinstance(hardware, PossibleMig):
            raise EditsError(f"MIG device {device.name} has not been created")
        return cdi.CdiDevice(
            name=cdi.device_name(ref.uid, _cdi_suffix(device)),
            edits=device_edits(device.name, hardware, self._caps_major),
        )

    def _start(
        self,
        planned: Sequence[ClaimPlan],
        replaced: Sequence[str],
        results: dict[str, PrepareResult],
    ) -> list[ClaimPlan]:
        """Reserve the devices of every plan as PrepareStarted; a plan whose device another claim
        holds gets an error naming that claim.

        The reservations are written to the checkpoint before anything is touched only when
        recovery needs them: sharing changes a GPU, a MIG device is made (its steps are recorded
        anyway), or earlier records were replaced (their spec files removed). Otherwise a crash
        leaves spec files without records, orphans recovery removes, and the call's write of
        PrepareCompleted is its only one."""
        started = []
        with self._state_lock:
            for uid in replaced:
                self._state.claims.pop(uid, None)
            holders = self._holders()
            for plan in planned:
                ref = plan.claim
                conflict = self._first_conflict(plan, holders)
                if conflict is not None:
                    results[ref.uid] = PrepareResult(error=conflict)
                    continue
                record = self._record(plan)
                self._state.claims[ref.uid] = record
                self._hold(holders, record)
                started.append(plan)
            if replaced or any(
                d.sharing or isinstance(d.hardware, PossibleMig) for plan in started for d in plan.devices
            ):
                self._store.save(self._state)
        return started

    def _record(self, plan: ClaimPlan) -> ClaimRecord:
        """The PrepareStarted record of a plan; built without re-validating what the plan
        already guarantees (a thousandth of a second per claim on a thousand-claim call)."""
        ref = plan.claim
        return ClaimRecord.model_construct(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=ClaimState.PREPARE_STARTED,
            devices=tuple(
                DeviceRecord.model_construct(
                    pool=d.pool,
                    device=d.name,
                    request_names=d.requests,
                    cdi_device_ids=(cdi.qualified_device_id(self.driver_name, ref.uid, _cdi_suffix(d)),),
                    admin_access=d.admin_access,
                    share_id=d.share_id,
                    uuid=d.uuid,
                    sharing=d.sharing.describe() if d.sharing else "",
                    mig=intent(d.hardware) if isinstance(d.hardware, PossibleMig) else None,
                    share=self._shares.record(d),
                )
                for d in plan.devices
            ),
            cdi_file=str(self._cdi.file_for(ref.uid)) if plan.devices else "",
            prepared_at=datetime.now(UTC),
            recovered=False,
        )

    def _first_conflict(self, plan: ClaimPlan, holders: _Holders) -> str | None:
        ref = plan.claim
        for device in plan.devices:
            holder = self._conflict(ref.uid, device, holders)
            if holder is not None:
                return (
                    f"claim {ref}: device {device.name} is already prepared for claim "
                    f"{holder.namespace}/{holder.name} ({holder.uid}) and cannot be shared"
                )
        return None

    def _gpu_key(self, device_name: str) -> str:
        """What two devices must share to overlap: the GPU (by minor) a device or placement is on."""
        hardware = self._hardware_of(device_name)
        return f"device {device_name}" if hardware is None else f"gpu {_silicon(hardware)[0]}"

    def _release_stale_holders(self, planned: Sequence[ClaimPlan]) -> None:
        """Unprepare claims that hold a device of the plans but whose ResourceClaim says they
        cannot be using it any more (deleted, deallocated, reserved for no pod).

        After a pod holding a GPU is force-deleted, the scheduler may give that GPU to a new pod
        before the kubelet has unprepared the old claim; refusing the new claim would leave its
        pod waiting for the kubelet's next resync (a minute or more). The API server is the
        authority here; without one (files, node-only mode) nothing is released.
        """
        if not self.claims.authoritative or not planned:
            return
        with self._state_lock:
            holders = self._holders()
            stale = {
                (h.uid, plan.claim): h
                for plan in planned
                for d in plan.devices
                if (h := self._conflict(plan.claim.uid, d, holders)) is not None
                and h.state is ClaimState.PREPARE_COMPLETED
                and h.name
            }
        released: list[str] = []
        for (uid, for_claim), holder in stale.items():
            if uid in released:
                continue
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
            with self._claim_lock(uid, timeout=HOLDER_LOCK_SECONDS) as locked:
                current = self._state.claims.get(uid)
                if not locked or current is None:
                    continue  # being unprepared right now, or gone already
                try:
                    self._release(current)
                except (SharingError, MigError) as err:
                    log.warning("cannot release a stale claim's devices", holder=str(ref), error=str(err))
                    continue
                self._forget([uid])
            released.append(uid)
            log.info(
                "unprepared a claim that no longer uses its devices, for the claim they were allocated to",
                claim=str(ref),
                uid=uid,
                reason=reason,
                for_claim=str(for_claim),
            )

    def _holders(self) -> _Holders:
        """Every prepared device by the silicon it is on: conflict checks look at a handful of
        devices instead of every prepared one (O(claims) per call, not O(claims²))."""
        holders: _Holders = {}
        for record in self._state.claims.values():
            self._hold(holders, record)
        return holders

    def _hold(self, holders: _Holders, record: ClaimRecord) -> None:
        for held in record.devices:
            if not held.admin_access:
                holders.setdefault(self._gpu_key(held.device), []).append((record, held))

    def _conflict(self, uid: str, device: PlannedDevice, holders: _Holders) -> ClaimRecord | None:
        if device.admin_access:
            return None
        for other, held in holders.get(self._gpu_key(device.name), []):
            if other.uid == uid or (device.share_id is not None and held.share_id is not None):
                continue
            if held.device == device.name or overlaps(self._hardware_of(held.device), device.hardware):
                return other
        return None

    def _hardware_of(self, name: str) -> Published | None:
        return self._devices.get(name)

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

    def _release(self, record: ClaimRecord, *, keep_cdi: bool = False) -> None:
        """Release sharing, destroy the MIG devices made for the claim and remove the spec (the
        caller forgets the record); safe to repeat after a crash. A
        MigError (e.g. a MIG device still in use) leaves the spec, so that the claim stays whole
        for the kubelet, or recovery, to try again."""
        self._shares.release(record)
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

    def _forget(self, uids: Sequence[str]) -> None:
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

    @contextmanager
    def _claim_lock(self, uid: str, timeout: float) -> Iterator[bool]:
        """One claim's lock, waiting at most `timeout` seconds; yields whether it was taken."""
        with self._locks_guard:
            entry = self._claim_locks_by_uid.setdefault(uid, [threading.Lock(), 0])
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
                    del self._claim_locks_by_uid[uid]

    @contextmanager
    def _claim_locks(self, uids: Sequence[str]) -> Iterator[None]:
        """Hold the locks of these claims, taken in sorted order so concurrent calls cannot deadlock."""
        ordered = sorted(set(uids))
        with self._locks_guard:
            entries = [self._claim_locks_by_uid.setdefault(uid, [threading.Lock(), 0]) for uid in ordered]
            for entry in entries:
                entry[1] += 1
        try:
            with ExitStack() as stack:
                for entry in entries:
                    stack.enter_context(entry[0])
                yield
        finally:
            with self._locks_guard:
                for uid, entry in zip(ordered, entries, strict=True):
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._claim_locks_by_uid[uid]


def _same_devices(record: ClaimRecord, claim: ResourceClaim, driver_name: str) -> bool:
    """Whether `record` is a finished preparation of the devices `claim` is allocated now (a
    claim deallocated and allocated again under its UID may have other devices)."""
    if record.state is not ClaimState.PREPARE_COMPLETED or record.recovered:
        return False
    allocation = claim.status.allocation
    results = allocation.devices.results if allocation is not None else ()
    allocated = {(r.pool, r.device, r.share_id or "") for r in results if r.driver == driver_name}
    return {(d.pool, d.device, d.share_id or "") for d in record.devices} == allocated


def _with_created_migs(record: ClaimRecord, devices: Sequence[PlannedDevice]) -> ClaimRecord:
    """The record with the UUID and compute instance of each MIG device made for it."""
    made = {d.name: d.hardware for d in devices if isinstance(d.hardware, MigDevice)}
    updated = []
    for device in record.devices:
        mig = made.get(device.device)
        if device.mig is not None and mig is not None:
            step = device.mig.model_copy(update={"ci_id": mig.ci_id})
            updated.append(device.model_copy(update={"uuid": mig.uuid, "mig": step}))
        else:
            updated.append(device)
    return record.model_copy(update={"devices": tuple(updated)})


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
