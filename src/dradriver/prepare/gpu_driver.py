"""The GPU driver behind the DRAPlugin services: prepare and unprepare claims, crash-safely.

`GpuDriver` is a thin facade over three units, each reviewable on its own:
- the ledger (`prepare.ledger`): the prepared state, its checkpoint and who holds which device,
  with the locking rule in its docstring;
- recovery (`prepare.recovery`): start-up rollback, rebuild from the CDI specs, the boot marker;
- the preparer (`prepare.preparer`): plan → reserve → MIG → sharing → CDI → complete, and its
  reverse, `prepare.unprepare`.

A claim's walk through them is in the package's docstring (`dradriver.prepare`). Calls are
serialized (`_exclusive`); with rolling updates two instances share the node's checkpoint, and
every call (after its claims are fetched) also holds `serialize.lock` across instances and starts
from the checkpoint as the other instance may have left it (see `prepare.serialize`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

from dradriver import logs
from dradriver.names import dns_label_error, dns_subdomain_error, uid_error
from dradriver.plugin.driver import ClaimRef, PrepareResult
from dradriver.prepare import cdi
from dradriver.prepare.checkpoint import CheckpointError, ClaimRecord
from dradriver.prepare.claims import ClaimSource
from dradriver.prepare.context import ClaimContext
from dradriver.prepare.devnodes import HostDeviceNodes
from dradriver.prepare.fetch import ClaimFetcher, route_for
from dradriver.prepare.gpu_share_daemons import ShareDaemons
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.metadata_files import MetadataFiles
from dradriver.prepare.mig import MigManager
from dradriver.prepare.preparer import NodeDevices, Preparer
from dradriver.prepare.recovery import Recovery, StartupRecovery
from dradriver.prepare.release import Release
from dradriver.prepare.resourceclaim import ResourceClaim
from dradriver.prepare.serialize import SerializeLock
from dradriver.prepare.sharing_settings import SharingControl
from dradriver.prepare.stale import StaleHolders
from dradriver.prepare.unprepare import Unpreparer

log = logs.get_logger(component="prepare")


def claim_ref_error(ref: ClaimRef) -> str | None:
    """Checked before a UID or name goes anywhere near a path or a request."""
    if (err := uid_error(ref.uid)) is not None:
        return f"claim {ref}: invalid UID {ref.uid!r}: {err}"
    if (err := dns_label_error(ref.namespace)) is not None:
        return f"claim {ref}: invalid namespace {ref.namespace!r}: {err}"
    if (err := dns_subdomain_error(ref.name)) is not None:
        return f"claim {ref}: invalid name {ref.name!r}: {err}"
    return None


class GpuDriver:
    """Prepares and unprepares claims on the node's devices, as `node()` says they are at each
    call (the live inventory replaces them); `on_released` is told after an unprepare (the
    inventory then drops devices that vanished while a claim held them)."""

    def __init__(
        self,
        *,
        driver_name: str,
        pool_name: str,
        ledger: Ledger,
        node: Callable[[], NodeDevices],
        claims: ClaimSource,
        cdi_dir: cdi.CdiDirectory,
        sharing: SharingControl,
        mig: MigManager,
        shares: ShareDaemons,
        metadata: MetadataFiles,
        serialize: SerializeLock | None = None,
        host_nodes: HostDeviceNodes | None = None,
        on_released: Callable[[], None] = lambda: None,
    ) -> None:
        self._node = node
        self._mig = mig
        self._serialize = serialize
        self._on_released = on_released
        #: One prepare, unprepare or recovery at a time in this process (see `_exclusive`).
        self._calls = threading.Lock()
        self._ledger = ledger
        release = Release(
            sharing=sharing, mig=mig, cdi_dir=cdi_dir, shares=shares, ledger=ledger, metadata=metadata
        )
        self._fetcher = ClaimFetcher(claims, route_for(claims))
        context = ClaimContext(driver_name, pool_name, ledger, cdi_dir, release, shares, metadata)
        self._recovery = StartupRecovery(context)
        self._unpreparer = Unpreparer(ledger, cdi_dir, metadata, release)
        self._preparer = Preparer(
            context,
            sharing=sharing,
            mig=mig,
            stale_holders=StaleHolders(claims, ledger, self._unpreparer, driver_name),
            host_nodes=host_nodes,
        )

    def held_devices(self) -> set[str]:
        """Names of the devices prepared claims hold (or are being prepared with)."""
        return self._ledger.held_devices()

    def recover(self) -> Recovery:
        """Make the checkpoint and the CDI directory agree again after a restart or a crash.

        With rolling updates the other instance may be mid-prepare: the lock waits for it."""
        with self._exclusive():
            return self._recovery.run(self._node().devices)

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
        for ref, claim in zip(valid.values(), self._fetcher.fetch_all(list(valid.values())), strict=True):
            if isinstance(claim, str):
                results[ref.uid] = PrepareResult(error=claim)
            else:
                fetched.append((ref, claim))
        with self._exclusive():
            results.update(self._preparer.run(fetched, self._node()))
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        with self._exclusive():
            errors = self._unpreparer.run(claims)
        self._on_released()
        return errors

    def records(self) -> list[ClaimRecord]:
        return self._ledger.records()

    def close(self) -> None:
        self._fetcher.close()
        self._mig.close()

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One call at a time, as the upstream helper serializes them: the kubelet sends one pod's
        claims per call, so concurrency would buy nothing. During a rolling update the lock spans
        the instances, and the call starts from the checkpoint as the other one last wrote it."""
        with self._calls:
            if self._serialize is None:
                yield
                return
            with self._serialize:
                try:
                    reloaded = self._ledger.reload_if_changed()
                except CheckpointError as err:
                    # Ours stays; the next save replaces the bad file with it.
                    log.error("the checkpoint another instance wrote cannot be read", reason=str(err))
                else:
                    if reloaded is not None:
                        log.debug("checkpoint reloaded: another instance changed it", claims=reloaded)
                yield
