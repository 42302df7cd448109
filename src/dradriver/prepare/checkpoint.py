"""The checkpoint: which claims this node has prepared, surviving restarts and `kill -9`.

File format (`checkpoint.json`, mode 0600):

    {"version": 1, "checksum": "sha256:<hex>", "data": {...}}

The checksum covers the canonical JSON (sorted keys, no spaces) of `data` *as read*, never a
re-encoding of our model, so a newer or older dradriver that adds or drops fields still
verifies the file (NVIDIA's driver crash-looped when re-marshalling changed its checksum).
Fields this version does not know (written by a newer one) are kept and written back as they
were, so a downgrade followed by an upgrade loses nothing. A file that fails any check is moved
aside, never fatal.

During a rolling update two instances share the file (taking turns under `serialize.lock`):
`changed_on_disk` tells an instance that the other one wrote it since it last read or wrote.

Durability: saves are not fsynced. A save that returned survives `kill -9` (the page cache is the
kernel's); only a power failure or a kernel crash can lose it, and after the reboot that follows
every prepared claim is void anyway (`read_boot_id`). Such a failure may leave an older version or,
on some filesystems, an empty file, and then the claims must not be rebuilt from the CDI directory
(its specs are the previous boot's): so each boot's first start writes the boot marker (`boot_id`,
fsynced with its directory) once recovery is done and before this boot's first save, and a
checkpoint missing or unreadable at a start in another boot than the marker's is known to be lost.
Where the kernel gives no boot id, every save is fsynced as before.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dradriver.files import FileReadError, read_bytes
from dradriver.files.write import (
    check_writable,
    ensure_directory,
    is_temp_name,
    storage_error,
    write_atomically,
)

CHECKPOINT_VERSION = 1
FILE_NAME = "checkpoint.json"
#: The boot id of the last boot that started here, beside the checkpoint (see Durability).
BOOT_MARKER = "boot_id"
FILE_MODE = 0o600
#: About 600 bytes a claim: room for 100,000 prepared claims, and a bound on what recovery reads.
MAX_BYTES = 64 * 1024 * 1024


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class _Model(BaseModel):
    # "allow": a newer version's fields survive our rewrite (model_dump includes them).
    model_config = ConfigDict(extra="allow", frozen=True)


class MigRecord(_Model):
    """A MIG device dradriver creates for the claim at its allocated placement.

    Written before each step (intent, then with the GPU instance id, then with the compute
    instance id), so that after a crash recovery knows what may exist and can remove it; only MIG
    devices recorded here are ever removed.
    """

    parent_uuid: str
    profile: str
    profile_id: int
    placement_start: int
    placement_size: int
    gi_id: int | None = None
    ci_id: int | None = None


class ShareRecord(_Model):
    """One share of a shared GPU (consumable capacity), as its MPS client is held to it: the
    pinned device memory limit (MiB) and active thread percentage. `enforced` is False under
    `--gpu-shares unenforced`. A GPU's MPS control daemon runs while any record names a share
    on it: recovery starts the missing ones and stops those no share needs."""

    memory_mib: int
    thread_percentage: int
    enforced: bool = True


class DeviceRecord(_Model):
    """One device of a prepared claim, as returned to the kubelet."""

    pool: str
    device: str
    request_names: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()
    admin_access: bool = False
    share_id: str | None = None
    #: Hardware identity at prepare time (GPU or MIG UUID), for `status` and audits.
    uuid: str = ""
    #: The sharing applied to it, e.g. "TimeSlicing(Long)" or "MPS"; "" for none. Undone on unprepare.
    sharing: str = ""
    #: Set when prepare creates this MIG device (--partitionable); destroyed on unprepare. Left
    #: out of the file when unset, so records without one read the same in every version.
    mig: MigRecord | None = Field(default=None, exclude_if=lambda value: value is None)
    #: Set for a share (`share_id`) prepared with limits; left out of the file when unset.
    share: ShareRecord | None = Field(default=None, exclude_if=lambda value: value is None)


class ClaimRecord(_Model):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[DeviceRecord, ...] = ()
    #: The CDI spec file written for the claim.
    cdi_file: str = ""
    #: What was written there: a repeated prepare and recovery check the file against it and
    #: rewrite it if it was deleted, emptied or changed. Left out of the file when unset.
    cdi_spec: dict[str, Any] | None = Field(default=None, exclude_if=lambda value: value is None)
    #: The device metadata objects written for it, by request (`prepare.metadata`): checked and
    #: rewritten as the spec is. Left out of the file when it has none.
    metadata: dict[str, dict[str, Any]] | None = Field(default=None, exclude_if=lambda value: value is None)
    prepared_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    #: Rebuilt from the CDI directory after the checkpoint was lost: name and namespace unknown.
    recovered: bool = False


class CheckpointData(_Model):
    boot_id: str = ""
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)

    def created_gpu_instances(self) -> dict[tuple[str, int], str]:
        """The GPU instances dradriver created for the claims recorded here, by (parent GPU UUID,
        GPU instance id), each with the placement device it was made for."""
        return {
            (device.mig.parent_uuid, device.mig.gi_id): device.device
            for claim in self.claims.values()
            for device in claim.devices
            if device.mig is not None and device.mig.gi_id is not None
        }


class CheckpointError(Exception):
    """The file exists but cannot be trusted (corrupt, checksum mismatch, unknown version)."""


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum(data: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical(data)).hexdigest()


def encode(checkpoint: CheckpointData) -> bytes:
    return _document(canonical(checkpoint.model_dump(mode="json")))


def _document(data: bytes) -> bytes:
    """The file for canonical `data`: it is serialized once, and checksummed as written."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return b'{"version":%d,"checksum":"%s","data":%s}' % (CHECKPOINT_VERSION, digest.encode(), data)


def decode(raw: bytes) -> CheckpointData:
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise CheckpointError(f"not valid JSON: {err}") from err
    if not isinstance(document, Mapping):
        raise CheckpointError("not a JSON object")
    if document.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"unknown checkpoint version {document.get('version')!r}")
    data = document.get("data")
    if document.get("checksum") != checksum(data):
        raise CheckpointError("checksum mismatch")
    try:
        return CheckpointData.model_validate(data)
    except ValidationError as err:
        raise CheckpointError(f"invalid content: {err.errors()[0]['msg']}") from err


class CheckpointStore:
    """Reads and atomically rewrites the checkpoint file in the state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FILE_NAME
        # Records are immutable: each is serialized once, not on every save of the file.
        self._fragments: dict[str, tuple[ClaimRecord, bytes]] = {}
        #: Identity of the file as we last read or wrote it (every write is a rename: a new inode).
        self._seen: tuple[int, int, int] | None = None
        self._marker = state_dir / BOOT_MARKER

    def load(self) -> CheckpointData | None:
        """The stored checkpoint, or None if there is none. Raises CheckpointError if untrustworthy
        (also when the path is a symlink, a device or larger than MAX_BYTES: never followed)."""
        self._remove_temp_files()
        try:
            raw = read_bytes(self.path, MAX_BYTES, follow_symlinks=False)
        except FileReadError as err:
            if err.errno == errno.ENOENT:
                self._seen = None
                return None
            raise CheckpointError(err.problem) from None
        # Under serialize.lock nobody else writes between the read and this stat.
        self._seen = _identity(os.stat(self.path))
        return decode(raw)

    def changed_on_disk(self) -> bool:
        """Whether someone else (another instance) replaced the file since our last load or save."""
        try:
            current: tuple[int, int, int] | None = _identity(os.stat(self.path))
        except FileNotFoundError:
            current = None
        return current != self._seen

    def _remove_temp_files(self) -> None:
        """Leftovers of saves interrupted by a crash."""
        try:
            leftovers = [p for p in self.path.parent.iterdir() if is_temp_name(p.name, FILE_NAME)]
        except (FileNotFoundError, NotADirectoryError):
            return
        for path in leftovers:
            path.unlink(missing_ok=True)

    def save(self, checkpoint: CheckpointData) -> None:
        """Write the whole checkpoint (the same bytes as `encode`), serializing only new records:
        the canonical form of the data is the canonical form of each record, in UID order."""
        fragments = {}
        for uid, record in checkpoint.claims.items():
            cached = self._fragments.get(uid)
            if cached is None or cached[0] is not record:
                cached = (record, canonical(record.model_dump(mode="json")))
            fragments[uid] = cached
        self._fragments = fragments
        claims = b",".join(canonical(uid) + b":" + fragments[uid][1] for uid in sorted(fragments))
        fields = {"boot_id": canonical(checkpoint.boot_id), "claims": b"{%s}" % claims}
        # A newer version's top-level fields, kept as encode keeps them (canonical: sorted keys).
        fields |= {key: canonical(value) for key, value in (checkpoint.model_extra or {}).items()}
        data = b"{%s}" % b",".join(canonical(key) + b":" + fields[key] for key in sorted(fields))
        try:
            ensure_directory(self.path.parent)
            # Without a boot id nothing tells a later boot that this state is void: it must be durable.
            write_atomically(self.path, _document(data), mode=FILE_MODE, durable=not checkpoint.boot_id)
        except OSError as err:  # the file is as it was: the caller undoes what it did in memory
            raise storage_error("write the checkpoint", self.path.parent, err) from err
        self._seen = _identity(os.stat(self.path))

    def check_writable(self) -> None:
        """StorageError unless a checkpoint as large as the current one can be written now (start-up
        checks before it changes anything)."""
        try:
            ensure_directory(self.path.parent)
            size = self.path.stat().st_size if self.path.is_file() else 0
            check_writable(self.path.parent, FILE_NAME, max(size, 4096))
        except OSError as err:
            raise storage_error("write the checkpoint", self.path.parent, err) from err

    def last_boot(self) -> str | None:
        """The boot id `mark_boot` last wrote, or None (never written, or unreadable)."""
        try:
            return read_bytes(self._marker, 1024, follow_symlinks=False).decode().strip() or None
        except (FileReadError, UnicodeDecodeError):
            return None

    def mark_boot(self, boot_id: str) -> None:
        """Durably note that this boot's saves begin (once a boot, when `last_boot` is another)."""
        try:
            ensure_directory(self.path.parent)
            write_atomically(self._marker, boot_id.encode() + b"\n", mode=FILE_MODE)
        except OSError as err:
            raise storage_error("write the boot marker", self.path.parent, err) from err

    def quarantine(self) -> Path:
        """Move an untrustworthy file aside (kept for post-mortems) so start-up can go on."""
        target = self.path.with_name(f"{FILE_NAME}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        self.path.replace(target)
        return target


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_boot_id(proc_root: Path = Path("/proc")) -> str:
    """The kernel's boot id: prepared state does not survive a reboot, as the kubelet expects."""
    try:
        return (proc_root / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
