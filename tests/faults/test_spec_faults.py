"""Specs are verified, not assumed: a prepared claim's CDI spec deleted, emptied or overwritten
(by hand, a cleaner, a broken disk) is written again by the kubelet's next prepare and by a
restart, and `dradriver status` shows it meanwhile (real files, the real CLI)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.mounts import remount
from tests.faults.prepared import one_claim_prepared, one_gpu
from tests.helpers import uid
from tests.prepare.node import Node
from tests.robustness.common import dradriver


def _delete(path: Path) -> None:
    path.unlink()


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xffnot json")


def _other_spec(path: Path) -> None:
    spec = json.loads(path.read_text())
    spec["devices"][0]["containerEdits"]["env"] = ["NVIDIA_VISIBLE_DEVICES=all"]
    path.write_text(json.dumps(spec))


TAMPER: dict[str, Callable[[Path], None]] = {
    "deleted": _delete,
    "emptied": _empty,
    "garbage": _garbage,
    "changed": _other_spec,
}


@pytest.mark.parametrize("how", list(TAMPER))
def test_a_repeated_prepare_rewrites_a_tampered_spec(node: Node, how: str) -> None:
    driver = node.driver()
    ref = node.add(one_gpu(1, "gpu-0"))
    first = driver.prepare([ref])
    written = node.spec(ref)
    TAMPER[how](node.cdi.file_for(ref.uid))
    assert driver.prepare([ref]) == first  # the same CDI IDs
    assert node.spec(ref) == written
    assert [p.name for p in node.cdi.path.iterdir()] == [node.cdi.file_for(ref.uid).name]  # no temp left
    driver.close()


def test_a_spec_that_cannot_be_rewritten_fails_the_repeated_prepare(node: Node) -> None:
    with one_claim_prepared(node, "cdi") as (driver, ref, cdi_dir):
        node.cdi.file_for(ref.uid).write_bytes(b"")
        remount(cdi_dir, "ro")
        error = driver.prepare([ref])[ref.uid].error
        assert f"its CDI spec was missing or changed and cannot rewrite it in {cdi_dir}: EROFS" in error
        remount(cdi_dir, "rw")
        assert driver.prepare([ref])[ref.uid].error == ""
        assert node.cdi.read(ref.uid) is not None


def test_a_restart_rewrites_tampered_specs_and_removes_unreadable_ones_of_no_claim(node: Node) -> None:
    driver = node.driver()
    refs = [node.add(one_gpu(n, f"gpu-{n}")) for n in range(4)]
    assert all(r.error == "" for r in driver.prepare(refs).values())
    written = {ref.uid: node.spec(ref) for ref in refs}
    driver.close()
    for ref, how in zip(refs, TAMPER.values(), strict=True):
        how(node.cdi.file_for(ref.uid))
    node.cdi.file_for(uid(10)).write_bytes(b"")  # specs of no claim, unreadable
    node.cdi.file_for(uid(11)).write_bytes(b"{garbage")
    restarted = node.driver(recover=False)
    report = restarted.recover()
    assert report.specs_rewritten == sorted(written)
    assert report.orphans_removed == [uid(10), uid(11)]
    assert {ref.uid: node.spec(ref) for ref in refs} == written
    assert sorted(node.cdi.claim_uids()) == sorted(written)
    restarted.close()


def test_status_reports_a_claim_whose_spec_is_missing_or_changed(node: Node) -> None:
    driver = node.driver()
    refs = [node.add(one_gpu(n, f"gpu-{n}")) for n in range(3)]
    assert all(r.error == "" for r in driver.prepare(refs).values())
    driver.close()
    node.cdi.file_for(refs[1].uid).unlink()
    _other_spec(node.cdi.file_for(refs[2].uid))
    state_dir = str(node.root / "state")
    result = dradriver("status", "--state-dir", state_dir, "-o", "json")
    assert result.returncode == 0, result.stderr
    claims = {c["uid"]: c["cdiSpec"] for c in json.loads(result.stdout)["claims"]}
    assert claims == {refs[0].uid: "ok", refs[1].uid: "missing", refs[2].uid: "differs"}
    table = dradriver("status", "--state-dir", state_dir, env={"COLUMNS": "200"}).stdout
    assert "spec missing" in table
    assert "spec changed" in table
    assert "2 claim(s) with a missing or changed CDI spec" in table
