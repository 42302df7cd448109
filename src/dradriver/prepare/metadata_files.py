"""Where the device metadata files of prepared claims live on the host (the I/O of `prepare.metadata`).

`<state dir>/device-metadata/<claim uid>/<request>.json`, one directory per claim: the claim's CDI
spec bind-mounts each file read-only, so the state directory must have the same path on the host
as in the plugin's container (the DaemonSet mounts it so). Files appear whole (`files.write`: temp
name, then rename) before the spec that mounts them; they go with the claim (unprepare, a rolled
back prepare) and, after a crash or a reboot, with every claim recovery does not keep; recovery
writes a kept claim's files again when they are missing or changed, from its record.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from dradriver import logs
from dradriver.files import FileReadError, read_bytes
from dradriver.files.write import ensure_directory, is_temp_name, storage_error, write_files_atomically
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare import cdi
from dradriver.prepare.checkpoint import ClaimRecord, ClaimState
from dradriver.prepare.metadata import ClaimMetadata, base_request, container_path, encode

SUBDIRECTORY = "device-metadata"
#: Containers running as any user read it; it names devices and the claim, nothing secret.
FILE_MODE = 0o644
#: Ours are a few KiB; a larger file in our place was not written by us.
MAX_FILE_BYTES = 256 * 1024

log = logs.get_logger(component="prepare")


class MetadataFiles:
    """The metadata files of prepared claims. `enabled` (serve --device-metadata) decides whether
    claims prepared from now on get them; the files of claims that have them are kept, restored
    and removed either way."""

    def __init__(self, state_dir: Path, driver_name: str, *, enabled: bool = True) -> None:
        self.path = state_dir / SUBDIRECTORY
        self._driver_name = driver_name
        self.enabled = enabled

    def file_for(self, claim_uid: str, request: str) -> Path:
        return self.path / claim_uid / f"{request}.json"

    def mounts(
        self, claim: ClaimRef, pod_claim_name: str | None, requests: Sequence[str]
    ) -> cdi.ContainerEdits:
        """The read-only mounts of a device serving `requests` (references as allocated)."""
        return cdi.ContainerEdits(
            mounts=tuple(
                cdi.Mount(
                    str(self.file_for(claim.uid, request)),
                    container_path(self._driver_name, claim.name, pod_claim_name, request),
                )
                for request in dict.fromkeys(base_request(r) for r in requests)
            )
        )

    def write_many(self, claims: Mapping[str, ClaimMetadata]) -> dict[str, OSError]:
        """Write the files of many claims (keyed by UID); the error of each that could not be."""
        errors: dict[str, OSError] = {}
        for uid, metadata in claims.items():
            directory = self.path / uid
            try:
                ensure_directory(directory)
            except OSError as err:
                errors[uid] = err
                continue
            files = {f"{request}.json": encode(obj) for request, obj in metadata.items()}
            failed = write_files_atomically(directory, files, mode=FILE_MODE)
            if failed:
                errors[uid] = next(iter(failed.values()))
        return errors

    def remove(self, claim_uid: str) -> None:
        """Remove a claim's files (none: nothing to do). OSError if they cannot be."""
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.path / claim_uid)

    def claim_uids(self) -> list[str]:
        """The UIDs of every claim with a directory here."""
        if not self.path.is_dir():
            return []
        return sorted(p.name for p in self.path.iterdir())

    def differs(self, record: ClaimRecord) -> bool:
        """Whether a file the record names is missing or not as written."""
        assert record.metadata is not None
        for request, obj in record.metadata.items():
            try:
                written = read_bytes(
                    self.file_for(record.uid, request), MAX_FILE_BYTES, follow_symlinks=False
                )
                if written != encode(obj):
                    return True
            except FileReadError:
                return True
        return False

    def remove_temp_files(self, claim_uid: str) -> None:
        """Leftovers of writes interrupted by a crash."""
        directory = self.path / claim_uid
        for name in os.listdir(directory) if directory.is_dir() else ():
            if is_temp_name(name, ""):
                (directory / name).unlink(missing_ok=True)


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
