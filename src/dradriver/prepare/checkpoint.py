"""The checkpoint: which claims this node has prepared, surviving restarts and `kill -9`.

File format (`checkpoint.json`, mode 0600):

    {"version": 1, "checksum": "sha256:<hex>", "data": {...}}

The checksum covers the canonical JSON (sorted keys, no spaces) of `data` *as read*, never a
re-encoding of our model, so a newer or older dradriver that adds or drops fields still
verifies the file (NVIDIA's driver crash-looped when re-marshalling changed its checksum).
Unknown fields are ignored on read. A file that fails any check is moved aside, never fatal.

Durability: each save fsyncs the new content before renaming it into place, so after a power
failure the file holds one complete version. Only the first save of a process also fsyncs the
directory (the file then surely exists); later renames need not be durable, because the claims
of a previous boot are dropped at start whichever version survived (`read_boot_id`).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dradriver.prepare.cdi import write_atomically

CHECKPOINT_VERSION = 1
FILE_NAME = "checkpoint.json"


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


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


class ClaimRecord(_Model):
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[DeviceRecord, ...] = ()
    #: The CDI spec file written for the claim.
    cdi_file: str = ""
    prepared_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    #: Rebuilt from the CDI directory after the checkpoint was lost: name and namespace unknown.
    recovered: bool = False


class CheckpointData(_Model):
    boot_id: str = ""
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)


class CheckpointError(Exception):
    """The file exists but cannot be trusted (corrupt, checksum mismatch, unknown version)."""


def canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checksum(data: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical(data)).hexdigest()


def encode(checkpoint: CheckpointData) -> bytes:
    return _document(checkpoint.model_dump(mode="json"))


def _document(data: dict[str, Any]) -> bytes:
    return json.dumps({"version": CHECKPOINT_VERSION, "checksum": checksum(data), "data": data}).encode()


def decode(raw: bytes) -> CheckpointData:
    try:
        document = json.loads(raw)
    except ValueError as err:
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
        # Records are immutable: each is converted to JSON once, not on every save of the file.
        self._dumped: dict[str, tuple[ClaimRecord, dict[str, Any]]] = {}
        self._directory_synced = False

    def load(self) -> CheckpointData | None:
        """The stored checkpoint, or None if there is none. Raises CheckpointError if untrustworthy."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return decode(raw)

    def save(self, checkpoint: CheckpointData) -> None:
        """Write the whole checkpoint (same bytes as `encode`), converting only changed records."""
        claims = {}
        for uid, record in checkpoint.claims.items():
            cached = self._dumped.get(uid)
            if cached is None or cached[0] is not record:
                cached = (record, record.model_dump(mode="json"))
            claims[uid] = cached
        self._dumped = claims
        data = {"boot_id": checkpoint.boot_id, "claims": {uid: dumped for uid, (_, dumped) in claims.items()}}
        write_atomically(self.path, _document(data), mode=0o600, sync_directory=not self._directory_synced)
        self._directory_synced = True

    def quarantine(self) -> Path:
        """Move an untrustworthy file aside (kept for post-mortems) so start-up can go on."""
        target = self.path.with_name(f"{FILE_NAME}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        self.path.replace(target)
        return target


def read_boot_id(proc_root: Path = Path("/proc")) -> str:
    """The kernel's boot id: prepared state does not survive a reboot, as the kubelet expects."""
    try:
        return (proc_root / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
