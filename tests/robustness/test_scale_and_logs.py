"""A call's cost is O(claims) with a bounded number of checkpoint writes; fake profiles have
sane bounds; log records are JSON for every source, carry no local variables and are bounded;
one key name per concept."""

from __future__ import annotations

import ast
import io
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

from dradriver import logs
from dradriver.backend.fake.sharing import FakeSharing
from dradriver.backend.select import open_backend
from dradriver.devicemodel import build_devices
from dradriver.devicemodel.shares import SharePolicy
from dradriver.discovery import DiscoveryError
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.cdi import CdiDirectory
from dradriver.prepare.claims import DirectoryClaimSource
from dradriver.prepare.edits import common_edits
from dradriver.prepare.gpu_driver import GpuDriver
from dradriver.prepare.gpu_share_daemons import ShareDaemons
from dradriver.prepare.ledger import Ledger
from dradriver.prepare.metadata_files import MetadataFiles
from dradriver.prepare.mig import MigManager
from dradriver.prepare.preparer import NodeDevices
from tests.helpers import DRIVER, allocated_claim, uid, write_gpu_profile
from tests.prepare.node import CountingStore

#: What each of the 1,000 shares consumes of its GPU (--gpu-shares unenforced: nothing enforced).
SHARE = {"memory": "1Gi", "computePercent": "1"}


def test_one_call_with_1000_claims_writes_the_checkpoint_a_bounded_number_of_times(tmp_path: Path) -> None:
    gpus = 8
    claims = [
        allocated_claim(
            f"c{i}",
            uid(i),
            [{"request": "gpu", "device": f"gpu-{i % gpus}", "shareID": uid(i), "consumedCapacity": SHARE}],
        )
        for i in range(1000)
    ]
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "claims.json").write_text(json.dumps({"kind": "List", "items": claims}))
    library = open_backend(str(write_gpu_profile(tmp_path / "profile.yaml", gpus)))
    inventory = library.discover()
    devices = build_devices(inventory, driver_name=DRIVER)
    store = CountingStore(tmp_path / "state")
    node = NodeDevices.published(
        devices.devices, common_edits(inventory.nvidia_uvm_major, []), inventory.nvidia_caps_major
    )
    driver = GpuDriver(
        driver_name=DRIVER,
        pool_name="node-1",
        ledger=Ledger(store, "boot"),
        node=lambda: node,
        claims=DirectoryClaimSource(tmp_path / "claims"),
        cdi_dir=CdiDirectory(tmp_path / "cdi", DRIVER),
        sharing=FakeSharing(tmp_path / "state"),
        mig=MigManager(lambda: library.mig_control(tmp_path / "state")),
        shares=ShareDaemons(SharePolicy("unenforced")),
        metadata=MetadataFiles(tmp_path / "device-metadata", DRIVER),
    )
    driver.recover()
    refs = [ClaimRef("default", f"c{i}", uid(i)) for i in range(1000)]
    store.saves = 0
    results = driver.prepare(refs)
    assert [r.error for r in results.values()] == [""] * 1000
    assert store.saves == 1  # PrepareCompleted for all (nothing shared: PrepareStarted is not written first)
    assert len(list((tmp_path / "cdi").glob("*.json"))) == 1000
    store.saves = 0
    assert driver.prepare(refs[:10]) == {r.uid: results[r.uid] for r in refs[:10]}  # idempotent
    assert store.saves == 0
    assert set(driver.unprepare(refs).values()) == {""}
    assert store.saves == 1
    assert list((tmp_path / "cdi").glob("*")) == []
    driver.close()


@pytest.mark.parametrize(
    ("group", "message"),
    [
        ({"count": 100_000_000}, "gpus[0].count: Input should be less than or equal to 1024"),
        ({"count": 600}, "gpus: 1200 GPUs in all; a profile may have at most 1024"),
        ({"memoryMiB": 2**40}, "gpus[0].memoryMiB: Input should be less than or equal to 2147483647"),
        ({"productName": "x" * 1000}, "gpus[0].productName: String should have at most 256 characters"),
    ],
)
def test_fake_profiles_have_upper_bounds(tmp_path: Path, group: dict[str, Any], message: str) -> None:
    gpu = {"productName": "T4", "architecture": "Turing", "computeCapability": "7.5", "memoryMiB": 15360}
    profile = {"driverVersion": "1", "cudaDriverVersion": "1", "gpus": [gpu | group, gpu | group]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(DiscoveryError, match=message.replace("[", r"\[").replace("]", r"\]")):
        open_backend(str(path))


# -- logs ---------------------------------------------------------------------------------------------


@pytest.fixture
def json_log() -> Any:
    stream = io.StringIO()
    logs.configure("json", 0, stream)
    yield stream
    logs.configure("console")


def _records(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_stdlib_records_and_warnings_are_json_too(json_log: io.StringIO) -> None:
    logging.getLogger("urllib3.connectionpool").warning("Retrying after %s", "a reset")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("an insecure request", UserWarning, stacklevel=1)
    first, second = _records(json_log)
    assert (first["level"], first["event"], first["logger"]) == (
        "warning",
        "Retrying after a reset",
        "urllib3.connectionpool",
    )
    assert second["logger"] == "py.warnings"
    assert "an insecure request" in second["event"]


def test_exception_records_carry_no_locals_and_are_bounded(json_log: io.StringIO) -> None:
    def prepare(claim: dict[str, Any]) -> None:
        secret = "a local that must not be logged"  # noqa: F841
        raise ValueError("x" * 100_000)

    try:
        prepare({"metadata": {"name": "y" * 100_000}})
    except ValueError:
        logs.get_logger(component="test").exception("prepare crashed", claim={"items": list(range(10_000))})
    [record] = _records(json_log)
    text = json.dumps(record)
    assert "a local that must not be logged" not in text
    assert "yyyy" not in text
    frames = record["exception"][0]["frames"]
    assert frames
    assert all(set(frame) == {"filename", "lineno", "name"} for frame in frames)  # no "locals"
    assert len(text.encode()) <= logs.MAX_RECORD_BYTES
    assert record["event"] == "prepare crashed"


def test_oversized_values_are_cut_and_say_so(json_log: io.StringIO) -> None:
    logs.get_logger(component="test").info(
        "big", error="e" * 10_000, devices=[f"gpu-{i}" for i in range(500)]
    )
    [record] = _records(json_log)
    assert record["error"].endswith(f"... ({10_000 - logs.MAX_VALUE_CHARS} more characters)")
    assert record["devices"][-1] == f"... {500 - logs.MAX_ITEMS} more items"


#: Keys that name a concept another key already names.
SYNONYMS = {
    "delay": "retry_in",
    "detail": "reason",
    "problem": "reason",
    "failure": "error",
    "err": "error",
    "exc": "error",
    "msg": "message",
    "file": "path",
    "filename": "path",
}


def test_one_key_per_concept_in_log_calls() -> None:
    found: dict[str, list[str]] = {}
    for path in sorted(Path(logs.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("debug", "info", "warning", "error", "exception")
                and "log" in ast.unparse(node.func.value)
            ):
                for keyword in node.keywords:
                    if keyword.arg in SYNONYMS:
                        found.setdefault(keyword.arg, []).append(f"{path.name}:{node.lineno}")
    assert found == {}, f"use the one key per concept: { ({k: SYNONYMS[k] for k in found}) } at {found}"
