"""The prepare pipeline for the fetched claims of one call, the only call running (see
`prepare.ledger` for why calls are serialized).

The claims go through the steps together:
1. plan each claim (`plan_claim`, pure) and build each device's CDI entry; a claim prepared
   already with the same devices is answered from its record, one prepared for another
   allocation is released first;
2. free the devices stale holders keep (`prepare.stale`);
3. reserve the devices of all of them as PrepareStarted (`Ledger.reserve`);
4. per claim, the steps (`Preparer._steps`): make the MIG devices of allocated MIG placements
   (each step recorded first), apply sharing, describe the devices (`prepare.metadata`), render
   the spec;
5. write every claim's device metadata, then every spec, in one batch each;
6. complete: record PrepareCompleted for all, and write the checkpoint once before the call
   answers.
The reservations reach the disk first (one more write) only when something a spec file cannot
tell recovery about is changed: sharing applied to a GPU, a MIG device made, an earlier record
replaced; otherwise a crash leaves spec files without records, orphans that recovery removes. So
a call costs O(claims) and one or two checkpoint writes, however many claims it carries, plus two
per MIG device made. The checkpoint write is the commit point: when it fails (a full, read-only
or failing disk) the call undoes what it set up for the claims it reserved, and nothing else, and
fails them, so the kubelet's retry does the work again. A repeated prepare checks each
claim's spec against the one recorded and rewrites it if it differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from dradriver import logs
from dradriver.devicemodel import Hardware, PossibleMig, PublishedDevice
from dradriver.discovery import Gpu, MigDevice
from dradriver.files.write import StorageError, storage_error
from dradriver.mig import MigError
from dradriver.plugin.driver import ClaimRef, PreparedDevice, PrepareResult
from dradriver.prepare import cdi
from dradriver.prepare.checkpoint import ClaimRecord, ClaimState, DeviceRecord, MigRecord
from dradriver.prepare.context import ClaimContext
from dradriver.prepare.devnodes import HostDeviceNodes
from dradriver.prepare.edits import EditsError, check_mig_access, device_edits
from dradriver.prepare.metadata import ClaimMetadata, DescribedDevice, MetadataError, check_names, with_uuid
from dradriver.prepare.metadata import render as render_metadata
from dradriver.prepare.metadata_files import restore_metadata
from dradriver.prepare.mig import MigManager, intent
from dradriver.prepare.plan import ClaimPlan, PlanError, PlannedDevice, plan_claim
from dradriver.prepare.recovery import restore_specs
from dradriver.prepare.resourceclaim import ResourceClaim
from dradriver.prepare.sharing_settings import SharingControl, SharingError
from dradriver.prepare.stale import StaleHolders

#: Calls with more claims than this log one "prepared claims" line instead of one per claim
#: (each still at debug level): a 3,000-claim call would otherwise spend a second logging.
LOG_EACH_CLAIM_UP_TO = 100

log = logs.get_logger(component="prepare")


@dataclass(frozen=True)
class NodeDevices:
    """What claims are prepared on: the node's devices, the edits every spec carries, the
    nvidia-caps major (MIG access) and each device's published attributes (its metadata);
    replaced whole when the node changes."""

    devices: Mapping[str, Hardware]
    common_edits: cdi.ContainerEdits
    caps_major: int | None
    attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def published(
        cls, devices: Iterable[PublishedDevice], common_edits: cdi.ContainerEdits, caps_major: int | None
    ) -> NodeDevices:
        """The node's published devices, as prepare works on them."""
        devices = list(devices)
        return cls(
            {d.name: d.hardware for d in devices},
            common_edits,
            caps_major,
            {d.name: d.json["attributes"] for d in devices},
        )


@dataclass
class _Batch:
    """What `Preparer._prepare` did."""

    results: dict[str, PrepareResult] = field(default_factory=dict)
    #: The records of the claims it prepared (not those it found prepared already).
    prepared: list[ClaimRecord] = field(default_factory=list)
    #: The UIDs of the claims it reserved: what a failed checkpoint write undoes.
    reserved: list[str] = field(default_factory=list)
    #: Whether the checkpoint must be written before the call answers.
    write: bool = False


@dataclass
class ClaimWork:
    """One claim on its way through the steps."""

    plan: ClaimPlan
    node: NodeDevices
    #: Its devices; the MIG step replaces each MIG placement with the MIG device made for it.
    devices: list[PlannedDevice]
    #: Each device's CDI entry, in the same order, built once: when planned, or for a MIG device
    #: made for the claim by the MIG step (None until then).
    entries: list[cdi.CdiDevice | None]
    #: The spec's claim-wide edits: the node's, then sharing's.
    edits: cdi.ContainerEdits
    #: The claim's name in its pod's spec, for a claim made from a template (its metadata's place).
    pod_claim_name: str | None = None
    #: Its device metadata, once described (None: --device-metadata off).
    metadata: ClaimMetadata | None = None
    #: The rendered spec (the last step).
    spec: dict[str, Any] | None = None

    @property
    def uid(self) -> str:
        return self.plan.claim.uid


#: A step of a claim's preparation; raises SharingError, MigError or EditsError to fail the claim.
Step = Callable[[ClaimWork], None]


@dataclass(eq=False)
class Preparer:
    context: ClaimContext
    _: KW_ONLY
    sharing: SharingControl
    mig: MigManager
    stale_holders: StaleHolders
    #: None with fake GPUs: their nodes are no host's.
    host_nodes: HostDeviceNodes | None

    def __post_init__(self) -> None:
        #: What each claim with devices goes through, in order, once its devices are reserved.
        self._steps: tuple[Step, ...] = (
            self._make_mig_devices,
            self._hold_shares,
            self._apply_sharing,
            *((self._describe_devices,) if self.context.metadata.enabled else ()),
            self._render_spec,
        )

    def run(
        self, claims: Sequence[tuple[ClaimRef, ResourceClaim]], node: NodeDevices
    ) -> dict[str, PrepareResult]:
        """Prepare the claims on `node` and write the checkpoint before answering if that changed
        anything; when a checkpoint write fails, undo what the call set up. The result of each
        claim, by UID."""
        batch = _Batch()
        try:
            self._prepare(claims, node, batch)
            if batch.write:
                # The spec files of the claims it prepared exist already: a crash before this
                # write leaves only orphans to remove.
                self.context.ledger.persist()
        except StorageError as err:
            self._undo(claims, batch, err)
        else:
            _log_prepared(batch.prepared)
        return batch.results

    def _prepare(
        self, claims: Sequence[tuple[ClaimRef, ResourceClaim]], node: NodeDevices, batch: _Batch
    ) -> None:
        """The pipeline, filling `batch`; the records change in memory only."""
        results = batch.results
        planned, replaced = self._plan_all(claims, node, results)
        self.stale_holders.free([w.plan for w in planned], node.devices)
        started = self._reserve(planned, replaced, node, results)
        batch.reserved = [w.uid for w in started]
        for work in started:
            if work.devices:  # a claim with no devices of ours gets no spec (an empty one is invalid)
                self._run_steps(work, results)
        specs = self._write_specs(started, results)
        completed = self.context.ledger.complete(specs)
        for record in completed:
            results[record.uid] = _result(record)
        batch.prepared = completed
        batch.write = bool(started or replaced)

    # --- 1. plan ----------------------------------------------------------------------------

    def _plan_all(
        self,
        claims: Sequence[tuple[ClaimRef, ResourceClaim]],
        node: NodeDevices,
        results: dict[str, PrepareResult],
    ) -> tuple[list[ClaimWork], list[str]]:
        """The work of each claim to prepare, and the UIDs whose earlier records it replaces; the
        claims prepared already are answered (their spec rewritten if it was changed)."""
        replaced: list[str] = []
        planned: list[ClaimWork] = []
        again: dict[ClaimRef, ClaimRecord] = {}
        for ref, claim in claims:
            existing = self.context.ledger.get(ref.uid)
            if existing is not None and _same_devices(existing, claim, self.context.driver_name):
                results[ref.uid] = _result(existing)  # idempotent: the kubelet may ask again
                again[ref] = existing
                continue
            if existing is not None:
                if (problem := self._replace(ref, existing)) is not None:
                    results[ref.uid] = PrepareResult(error=problem)
                    continue
                replaced.append(ref.uid)
            try:
                planned.append(self._plan(ref, claim, node))
            except (PlanError, EditsError, MetadataError) as err:
                log.warning("cannot prepare claim", claim=str(ref), error=str(err))
                results[ref.uid] = PrepareResult(error=str(err))
        _, failed_rewrites = restore_specs(self.context.cdi_dir, list(again.values()))
        _, failed_metadata = restore_metadata(self.context.metadata, list(again.values()))
        for ref in again:
            if (rewrite_error := failed_rewrites.get(ref.uid) or failed_metadata.get(ref.uid)) is not None:
                results[ref.uid] = PrepareResult(error=f"claim {ref}: {rewrite_error}")
        return planned, replaced

    def _replace(self, ref: ClaimRef, existing: ClaimRecord) -> str | None:
        """Release the claim's record of another allocation (or of an unfinished attempt): the
        error when that cannot be undone."""
        if existing.state is ClaimState.PREPARE_COMPLETED and not existing.recovered:
            log.warning("claim was prepared for another allocation: preparing it again", claim=str(ref))
        try:
            self.context.release(existing, keep_cdi=existing.recovered)
        except (SharingError, MigError) as err:
            return f"claim {ref}: cannot undo an earlier attempt: {err}"
        return None

    def _plan(self, ref: ClaimRef, claim: ResourceClaim, node: NodeDevices) -> ClaimWork:
        """The claim's plan on `node` with every device's CDI entry that can be built before
        anything is touched; for a MIG placement, whether the MIG device will be usable; with
        device metadata, whether its names can place it."""
        plan = plan_claim(
            claim,
            ref,
            driver_name=self.context.driver_name,
            pool_name=self.context.pool_name,
            devices=node.devices,
        )
        entries: list[cdi.CdiDevice | None] = []
        for device in plan.devices:
            if isinstance(device.hardware, PossibleMig):
                check_mig_access(device.name, node.caps_major)
                entries.append(None)
            else:
                entries.append(_cdi_device(ref.uid, device, device.hardware, node.caps_major))
        pod_claim_name = claim.metadata.pod_claim_name
        if self.context.metadata.enabled:
            check_names(ref, pod_claim_name, [r for d in plan.devices for r in d.requests])
        return ClaimWork(plan, node, list(plan.devices), entries, node.common_edits, pod_claim_name)

    # --- 3. reserve -------------------------------------------------------------------------

    def _reserve(
        self,
        planned: Sequence[ClaimWork],
        replaced: Sequence[str],
        node: NodeDevices,
        results: dict[str, PrepareResult],
    ) -> list[ClaimWork]:
        """Record the claims PrepareStarted: those whose devices no other claim holds."""
        conflicts = self.context.ledger.reserve(
            [(w.plan, self._record(w.plan)) for w in planned], replaced, node.devices
        )
        for uid, conflict in conflicts.items():
            results[uid] = PrepareResult(error=conflict)
        return [w for w in planned if w.uid not in conflicts]

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
                    cdi_device_ids=(
                        cdi.qualified_device_id(self.context.driver_name, ref.uid, _cdi_suffix(d)),
                    ),
                    admin_access=d.admin_access,
                    share_id=d.share_id,
                    uuid=d.uuid,
                    sharing=d.sharing.describe() if d.sharing else "",
                    mig=intent(d.hardware) if isinstance(d.hardware, PossibleMig) else None,
                    share=self.context.shares.record(d),
                )
                for d in plan.devices
            ),
            cdi_file=str(self.context.cdi_dir.file_for(ref.uid)) if plan.devices else "",
            prepared_at=datetime.now(UTC),
            recovered=False,
        )

    # --- 4. the steps of each claim ---------------------------------------------------------

    def _run_steps(self, work: ClaimWork, results: dict[str, PrepareResult]) -> None:
        try:
            for step in self._steps:
                step(work)
        except (SharingError, MigError, EditsError) as err:
            self._fail(work.uid, err, results)

    def _make_mig_devices(self, work: ClaimWork) -> None:
        """Make a MIG device at each allocated MIG placement (each step recorded first), then
        record what was made and build the CDI entries of the made devices."""
        made: dict[int, MigDevice] = {}
        for i, device in enumerate(work.devices):
            placement = device.hardware
            if not isinstance(placement, PossibleMig):
                continue

            def record(step: MigRecord, name: str = device.name) -> None:
                self.context.ledger.record_mig(work.uid, name, step)

            made[i] = self.mig.create(placement, record)
            work.devices[i] = replace(device, hardware=made[i])
        if not made:
            return
        started = self.context.ledger.get(work.uid)
        assert started is not None, "a started claim without its record"
        self.context.ledger.put(_with_created_migs(started, work.devices))
        for i, mig_device in made.items():
            work.entries[i] = _cdi_device(work.uid, work.devices[i], mig_device, work.node.caps_major)

    def _hold_shares(self, work: ClaimWork) -> None:
        """Each GPU share's limits added to its entry, its GPU's daemon started first if need be."""
        entries = [e for e in work.entries if e is not None]
        assert len(entries) == len(work.devices), "a device without its CDI entry"
        work.entries = list(
            self.context.shares.prepare(work.plan.claim, work.devices, entries, self.context.ledger.records)
        )

    def _apply_sharing(self, work: ClaimWork) -> None:
        """Apply each sharing configuration to the devices it is for; its edits join the claim's."""
        groups: dict[str, list[PlannedDevice]] = {}
        for device in work.devices:
            if device.sharing is not None:
                groups.setdefault(device.sharing.model_dump_json(), []).append(device)
        edits = cdi.ContainerEdits()
        for group in groups.values():
            sharing = group[0].sharing
            assert sharing is not None
            edits = edits + self.sharing.apply(work.uid, sharing, group)
        work.edits = work.edits + edits

    def _describe_devices(self, work: ClaimWork) -> None:
        """The claim's device metadata, each request's file mounted on each of its devices."""
        ref, files = work.plan.claim, self.context.metadata
        described = [
            DescribedDevice(
                d.pool, d.name, d.requests, with_uuid(work.node.attributes.get(d.name, {}), d.uuid)
            )
            for d in work.devices
        ]
        work.metadata = render_metadata(ref, work.pod_claim_name, self.context.driver_name, described)
        entries: list[cdi.CdiDevice | None] = []
        for device, entry in zip(work.devices, work.entries, strict=True):
            assert entry is not None, "a device without its CDI entry"
            mounts = files.mounts(ref, work.pod_claim_name, device.requests)
            entries.append(cdi.CdiDevice(entry.name, entry.edits + mounts))
        work.entries = entries

    def _render_spec(self, work: ClaimWork) -> None:
        """The claim's spec, once every device node it names exists on the host."""
        entries = tuple(e for e in work.entries if e is not None)
        assert len(entries) == len(work.devices), "a device without its CDI entry"
        edits = work.edits
        if self.host_nodes is not None:
            edits = self.host_nodes.complete(edits, (e.edits for e in entries))
        work.spec = cdi.render(cdi.ClaimSpec(cdi.kind(self.context.driver_name), entries, edits))

    # --- 5. write the specs -----------------------------------------------------------------

    def _write_specs(
        self, started: Sequence[ClaimWork], results: dict[str, PrepareResult]
    ) -> dict[str, tuple[Mapping[str, object] | None, ClaimMetadata | None]]:
        """Write the device metadata, then the specs, of the claims whose steps went through, in
        one batch each: the spec and metadata of each claim to complete (None: a claim with no
        devices of ours, or none described), by UID."""
        unwritten = self.context.metadata.write_many(
            {w.uid: w.metadata for w in started if w.metadata is not None and w.uid not in results}
        )
        for uid, os_error in unwritten.items():
            self._fail(
                uid, storage_error("write the device metadata", self.context.metadata.path, os_error), results
            )
        written = self.context.cdi_dir.write_many(
            {w.uid: w.spec for w in started if w.spec is not None and w.uid not in results}
        )
        specs: dict[str, tuple[Mapping[str, object] | None, ClaimMetadata | None]] = {}
        for work in started:
            if work.uid in results:  # failed in a step, or its metadata was not written
                continue
            if (error := written.get(work.uid)) is not None:
                problem = (
                    storage_error("write the CDI spec", self.context.cdi_dir.path, error)
                    if isinstance(error, OSError)
                    else error
                )
                self._fail(work.uid, problem, results)
            else:
                specs[work.uid] = (work.spec, work.metadata)
        return specs

    # --- failures ---------------------------------------------------------------------------

    def _fail(self, uid: str, error: Exception, results: dict[str, PrepareResult]) -> None:
        """Roll a started claim back and fail it."""
        record = self.context.ledger.get(uid)
        assert record is not None, "a started claim without its record"
        ref = ClaimRef(record.namespace, record.name, record.uid)
        self._roll_back(record)
        log.warning("prepare failed, rolled back", claim=str(ref), error=str(error))
        if isinstance(error, MigError) and error.reason == "insufficient_resources":
            message = (
                f"claim {ref}: cannot create the MIG device: {error} (the GPU has no room at the allocated "
                "placement: a MIG device made outside dradriver may overlap it)"
            )
        else:
            message = f"claim {ref}: {error}"
        results[uid] = PrepareResult(error=message)

    def _undo(
        self, claims: Sequence[tuple[ClaimRef, ResourceClaim]], batch: _Batch, error: StorageError
    ) -> None:
        """A checkpoint write of the call failed: roll back the claims it reserved, and nothing
        else, and fail each claim it would have prepared; the kubelet's retry does the work again."""
        undone = 0
        for uid in batch.reserved:
            # None: rolled back when one of its steps failed.
            if (record := self.context.ledger.get(uid)) is not None and self._roll_back(record):
                undone += 1
        for ref, _ in claims:
            result = batch.results.get(ref.uid)
            if result is None or (ref.uid in batch.reserved and not result.error):
                batch.results[ref.uid] = PrepareResult(error=f"claim {ref}: not prepared: {error}")
        log.error("prepare not recorded: undone", claims=undone, error=str(error))

    def _roll_back(self, record: ClaimRecord) -> bool:
        """Release what was set up for a started claim and forget its record (in memory: the
        call's checkpoint write, or the next, drops it from the disk). What cannot be undone yet
        (a MIG device NVML will not destroy) stays recorded, PrepareStarted, for the retry or
        recovery: False then."""
        ref = ClaimRef(record.namespace, record.name, record.uid)
        try:
            self.context.release(record)
        except (SharingError, MigError) as undo_error:
            log.error("prepare failed and could not be rolled back", claim=str(ref), error=str(undo_error))
            self.context.ledger.put(record.model_copy(update={"state": ClaimState.PREPARE_STARTED}))
            return False
        except OSError as undo_error:  # a spec file no record names: recovery removes it
            log.error("prepare rolled back, its spec not removed", claim=str(ref), error=str(undo_error))
        self.context.ledger.drop([record.uid])
        return True


def _log_prepared(completed: Sequence[ClaimRecord]) -> None:
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


def _cdi_device(
    uid: str, device: PlannedDevice, hardware: Gpu | MigDevice, caps_major: int | None
) -> cdi.CdiDevice:
    """The device's CDI entry, on `hardware` (a MIG device made for it, or what was planned)."""
    return cdi.CdiDevice(
        name=cdi.device_name(uid, _cdi_suffix(device)), edits=device_edits(device.name, hardware, caps_major)
    )


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
