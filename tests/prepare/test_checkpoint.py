"""The checkpoint codec: versioned, checksummed over what was read, tolerant of unknown fields."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from dradriver.prepare.checkpoint import (
    CheckpointData,
    CheckpointError,
    CheckpointStore,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
    checksum,
    decode,
    encode,
)

GOLDEN = Path(__file__).parent / "golden" / "checkpoint-v1.json"


def sample() -> CheckpointData:
    record = ClaimRecord(
        uid="00000000-0000-4000-8000-000000000001",
        namespace="default",
        name="one-gpu",
        state=ClaimState.PREPARE_COMPLETED,
        devices=(
            DeviceRecord(
                pool="node-1",
                device="gpu-0",
                request_names=("gpu",),
                cdi_device_ids=("k8s.gpu.dradriver.dev/claim=00000000-0000-4000-8000-000000000001-gpu-0",),
                uuid="GPU-11111111-2222-3333-4444-555555555555",
                sharing="TimeSlicing(Long)",
            ),
        ),
        cdi_file="/var/run/cdi/k8s.gpu.dradriver.dev-claim_00000000-0000-4000-8000-000000000001.json",
        prepared_at="2026-11-21T10:00:00Z",  # type: ignore[arg-type]
    )
    return CheckpointData(boot_id="boot-1", claims={record.uid: record})


def test_round_trip_matches_the_golden_file() -> None:
    encoded = encode(sample())
    assert json.loads(encoded) == json.loads(GOLDEN.read_text())
    assert decode(GOLDEN.read_bytes()) == sample()


def test_fields_from_another_version_do_not_break_the_checksum() -> None:
    document = json.loads(GOLDEN.read_text())
    record = next(iter(document["data"]["claims"].values()))
    record["futureField"] = {"added": "by a newer dradriver"}
    del record["cdi_file"]  # and one an older version never wrote
    document["checksum"] = checksum(document["data"])
    loaded = decode(json.dumps(document, indent=4).encode())  # formatting does not matter either
    assert loaded.claims[record["uid"]].cdi_file == ""


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[]", "not a JSON object"),
        (b'{"version": 2, "checksum": "", "data": {}}', "unknown checkpoint version 2"),
        (b'{"version": 1, "checksum": "sha256:00", "data": {}}', "checksum mismatch"),
    ],
)
def test_untrustworthy_files_are_rejected(raw: bytes, reason: str) -> None:
    with pytest.raises(CheckpointError, match=reason):
        decode(raw)


def test_a_flipped_byte_is_caught() -> None:
    raw = GOLDEN.read_bytes().replace(b"one-gpu", b"one-gpv")
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        decode(raw)


def test_store_writes_0600_atomically_and_quarantines(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "state")
    assert store.load() is None
    store.save(sample())
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.load() == sample()
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["checkpoint.json"]
    store.path.write_text("garbage")
    with pytest.raises(CheckpointError):
        store.load()
    moved = store.quarantine()
    assert moved.read_text() == "garbage"
    assert moved.name.startswith("checkpoint.json.corrupt-")
    assert store.load() is None


def test_store_writes_exactly_what_encode_gives(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    checkpoint = sample()
    store.save(checkpoint)
    assert store.path.read_bytes() == encode(checkpoint)
    record = next(iter(checkpoint.claims.values()))
    changed = CheckpointData(
        boot_id="boot-2",
        claims={record.uid: record.model_copy(update={"state": ClaimState.PREPARE_STARTED}), "x": record},
    )
    store.save(changed)  # one record reused from the cache, one new
    assert store.path.read_bytes() == encode(changed)
    assert decode(store.path.read_bytes()) == changed
