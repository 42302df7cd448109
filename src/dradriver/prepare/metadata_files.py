"""Where the device metadata files of prepared claims live on the host (the I/O of `prepare.metadata`).

`<dir>/<claim uid>_<request>.json` (serve --device-metadata-dir; the DaemonSet's is on the host's
/run): best a tmpfs, as the runtime's CDI directory is, since the files die with the boot as the
claims do, and since a write there costs a tenth of one on a disk. The claim's CDI spec
bind-mounts each file read-only, so the directory has the same path on the host as in the
plugin's container (the DaemonSet mounts /run/dradriver so). One directory for all: a directory
per claim would cost a mkdir and an rmdir per claim. Files appear whole (`files.write`: temp name,
then swapped in) before the spec that mounts them; they go with the claim (unprepare, a rolled back
prepare) and, after a crash, with every claim recovery does not keep; recovery writes a kept
claim's files again when they are missing or changed, from its record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from dradriver import logs
from dradriver.files import FileReadError, read_bytes
from dradriver.files.write import ensure_directory, storage_error, write_files_atomically
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare import cdi
from dradriver.prepare.checkpoint import ClaimRecord, ClaimState
from dradriver.prepare.metadata import ClaimMetadata, base_request, container_path, encode

#: Containers running as any user read it; it names devices and the claim, nothing secret.
FILE_MODE = 0o644
#: Ours are a few KiB; a larger file in our place was not written by us.
MAX_FILE_BYTES = 256 * 1024

log = logs.get_logger(component="prepare")


def file_name(claim_uid: str, request: str) -> str:
    # A UID has no "_" and a request name (a DNS label) neither: the name splits back.
    return f"{claim_uid}_{request}.json"


class MetadataFiles:
    """The metadata files of prepared claims. `enabled` (serve --device-metadata) decides whether
    claims prepared from now on get them; the files of claims that have them are kept, restored
    and removed either way."""

    def __init__(self, directory: Path, driver_name: str, *, enabled: bool = True) -> None:
        self.path = directory
        self._prefix = f"{directory}/"
        self._driver_name = driver_name
        self.enabled = enabled

    def file_for(self, claim_uid: str, request: str) -> str:
        """Its path (a string: built for every device of every claim, a Path costs ten times more)."""
        return self._prefix + file_name(claim_uid, request)

    def mounts(
        self, claim: ClaimRef, pod_claim_name: str | None, requests: Sequence[str]
    ) -> cdi.ContainerEdits:
        """The read-only mounts of a device serving `requests` (references as allocated)."""
        return cdi.ContainerEdits(
            mounts=tuple(
                cdi.Mount(
                    self.file_for(claim.uid, request),
                    container_path(self._driver_name, claim.name, pod_claim_name, request),
                )
                for request in dict.fromkeys(base_request(r) for r in requests)
            )
        )

    def write_many(self, claims: Mapping[str, ClaimMetadata]) -> dict[str, OSError]:
        """Write the files of many claims (keyed by UID) in one batch; the error of each claim
        whose files could not all be written."""
        if not claims:
            return {}
        try:
            ensure_directory(self.path)
        except OSError as err:
            return dict.fromkeys(claims, err)
        owners = {
            file_name(uid, request): (uid, encode(obj))
            for uid, metadata in claims.items()
            for request, obj in metadata.items()
        }
        failed = write_files_atomically(
            self.path, {name: data for name, (_, data) in owners.items()}, mode=FILE_MODE
        )
        return {owners[name][0]: err for name, err in failed.items()}

    def remove(self, record: ClaimRecord) -> None:
        """Remove a claim's files (none: nothing to do); OSError if one cannot be. A record rebuilt
        from the CDI directory names none: its files are found by the UID."""
        names = (
            [file_name(record.uid, request) for request in record.metadata]
            if record.metadata is not None
            else self._names_of({record.uid})
        )
        for name in names:
            (self.path / name).unlink(missing_ok=True)

    def remove_all_but(self, kept: Iterable[str]) -> list[str]:
        """Remove the files of every claim but the `kept` UIDs, and leftovers of writes a crash
        interrupted: the UIDs whose files were removed."""
        keep = set(kept)
        removed: set[str] = set()
        for name in self._names():
            uid = name.partition("_")[0]
            if name.startswith(".") or uid not in keep:
                (self.path / name).unlink(missing_ok=True)
                if not name.startswith("."):
                    removed.add(uid)
        return sorted(removed)

    def differs(self, record: ClaimRecord) -> bool:
        """Whether a file the record names is missing or not as written."""
        assert record.metadata is not None
        for request, obj in record.metadata.items():
            try:
                written = read_bytes(
                    self.file_for(record.uid, request), MAX_FILE_BYTES, follow_symlinks=False
                )
            except FileReadError:
                return True
            if written != encode(obj):
                return True
        return False

    def _names(self) -> list[str]:
        return [p.name for p in self.path.iterdir()] if self.path.is_dir() else []

    def _names_of(self, uids: set[str]) -> list[str]:
        return [n for n in self._names() if n.partition("_")[0] in uids]


def restore_metadata(
    files: MetadataFiles, records: Sequence[ClaimRecord]
) -> tuple[list[str], dict[str, str]]:
    """Rewrite the files of each prepared claim whose files are missing or differ from what was
    written: the UIDs rewritten, and the error of each that cannot be."""
    stale = {
        r.uid: r.metadata
        for r in records
        if r.metadata is not None and r.state is ClaimState.PREPARE_COMPLETED and files.differs(r)
    }
    if not stale:
        return [], {}
    log.warning("device metadata of prepared claims was missing or changed: rewriting", claims=sorted(stale))
    errors = {
        uid: "its device metadata was missing or changed and "
        + str(storage_error("rewrite it", files.path, err))
        for uid, err in files.write_many(stale).items()
    }
    return sorted(stale.keys() - errors.keys()), errors
