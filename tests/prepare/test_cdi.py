"""CDI rendering and validation, checked against the rules runtimes enforce (cdi.md §1)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dradriver.prepare import cdi
from dradriver.prepare.cdi import CdiDevice, ClaimSpec, ContainerEdits, DeviceNode, Mount

DRIVER = "gpu.dradriver.dev"
UID = "0a1b2c3d-0000-4000-8000-000000000001"


def test_names_follow_the_driver_name() -> None:
    assert cdi.vendor(DRIVER) == "k8s.gpu.dradriver.dev"
    assert cdi.kind(DRIVER) == "k8s.gpu.dradriver.dev/claim"
    assert cdi.spec_file_name(DRIVER, UID) == f"k8s.gpu.dradriver.dev-claim_{UID}.json"
    assert cdi.qualified_device_id(DRIVER, UID, "gpu-0") == f"k8s.gpu.dradriver.dev/claim={UID}-gpu-0"


def gpu_spec(uid: str = UID, common: ContainerEdits | None = None) -> ClaimSpec:
    node = DeviceNode(path="/dev/nvidia0", type="c", major=195, minor=0)
    return ClaimSpec(
        kind=cdi.kind(DRIVER),
        devices=(
            CdiDevice(cdi.device_name(uid, "gpu-0"), ContainerEdits(env=("A=1",), device_nodes=(node,))),
        ),
        common=common or ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=void",)),
    )


def test_render_picks_the_lowest_version_the_content_needs() -> None:
    rendered = cdi.render(gpu_spec())
    assert rendered["cdiVersion"] == "0.5.0"  # device names start with a digit (the claim UID)
    assert rendered["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}
    ]
    letter_first = cdi.render(gpu_spec(uid="a1b2c3d4-0000-4000-8000-000000000001"))
    assert letter_first["cdiVersion"] == "0.3.0"
    assert cdi.minimum_version(
        {"kind": "a/b", "devices": [], "containerEdits": {"mounts": [{"type": "bind"}]}}
    ) == ("0.4.0")
    assert cdi.minimum_version({"kind": "a/b.c", "devices": []}) == "0.6.0"
    assert cdi.minimum_version({"kind": "a/b", "annotations": {"x": "y"}, "devices": []}) == "0.6.0"
    assert cdi.validate(rendered) == []


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda s: s.update(kind="9vendor/claim"), "kind"),
        (lambda s: s.update(kind="vendor"), "kind"),
        (lambda s: s["devices"][0].update(name="-bad"), "invalid CDI device name"),
        (lambda s: s["devices"].append(dict(s["devices"][0])), "duplicate device name"),
        (lambda s: s["devices"][0].update(containerEdits={}), "must not be empty"),
        (lambda s: s.update(devices=[]), "devices: must not be empty"),
        (lambda s: s["containerEdits"].update(env=["=oops"]), "must be NAME=value"),
        (
            lambda s: s["containerEdits"].update(mounts=[{"hostPath": "/x", "containerPath": "/y"}]),
            "bind or rbind",
        ),
        (lambda s: s["containerEdits"].update(deviceNodes=[{"path": "dev/x"}]), "absolute path"),
        (lambda s: s["containerEdits"].update(deviceNodes=[{"path": "/dev/x", "type": "z"}]), "b, c, u, p"),
    ],
)
def test_validation_rejects_what_runtimes_reject(mutate: object, problem: str) -> None:
    spec = cdi.render(gpu_spec())
    mutate(spec)  # type: ignore[operator]
    assert any(problem in p for p in cdi.validate(spec)), cdi.validate(spec)


def test_directory_writes_whole_files_only(tmp_path: Path) -> None:
    directory = cdi.CdiDirectory(tmp_path / "cdi", DRIVER)
    old_umask = os.umask(0o077)
    try:
        path = directory.write(UID, cdi.render(gpu_spec()))
    finally:
        os.umask(old_umask)
    assert path.name == f"k8s.gpu.dradriver.dev-claim_{UID}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by the runtime whatever our umask
    assert json.loads(path.read_text())["kind"] == "k8s.gpu.dradriver.dev/claim"
    assert directory.claim_uids() == [UID]
    assert [p.name for p in (tmp_path / "cdi").iterdir()] == [path.name]  # no temp file left behind
    with pytest.raises(cdi.InvalidSpecError, match="devices: must not be empty"):
        directory.write(UID, {"cdiVersion": "0.5.0", "kind": cdi.kind(DRIVER), "devices": []})
    assert json.loads(path.read_text())["devices"]  # the invalid spec did not replace the good one
    assert directory.remove(UID)
    assert not directory.remove(UID)
    assert directory.claim_uids() == []


def test_directory_ignores_other_vendors_and_cleans_temp_files(tmp_path: Path) -> None:
    (tmp_path / "nvidia.com-gpu.yaml").write_text("x")
    (tmp_path / f".k8s.gpu.dradriver.dev-claim_{UID}.json.tmp").write_text("{half")
    directory = cdi.CdiDirectory(tmp_path, DRIVER)
    assert directory.claim_uids() == []
    assert len(directory.remove_temp_files()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvidia.com-gpu.yaml"]


def test_mounts_carry_bind_options() -> None:
    rendered = cdi.render(
        gpu_spec(common=ContainerEdits(mounts=(Mount("/usr/bin/nvidia-smi", "/x/nvidia-smi"),)))
    )
    assert rendered["containerEdits"]["mounts"][0]["options"] == [
        "ro",
        "nosuid",
        "nodev",
        "rbind",
        "rprivate",
    ]
    assert cdi.validate(rendered) == []


def test_claim_wide_edits_shared_by_specs_are_encoded_and_checked_as_their_own() -> None:
    """The host driver's mounts go into every spec: worked out once per edits object, what is
    written and what is refused are what the whole spec gives."""
    mounts = tuple(cdi.Mount(f"/host/lib{i}.so.1", f"/usr/lib64/lib{i}.so.1") for i in range(40))
    common = cdi.ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=void",), mounts=mounts)
    assert common + cdi.ContainerEdits() is common
    for n in range(3):
        device = cdi.CdiDevice(f"uid{n}-gpu-{n}", cdi.ContainerEdits(env=(f"N={n}",)))
        spec = cdi.render(cdi.ClaimSpec("k8s.gpu.dradriver.dev/claim", (device,), common))
        assert cdi.validate(spec) == []
        assert json.loads(cdi.encode(spec)) == json.loads(json.dumps(spec))
    bad = cdi.ContainerEdits(mounts=(cdi.Mount("relative", "/x", ("ro",)),))
    spec = cdi.render(cdi.ClaimSpec("k8s.gpu.dradriver.dev/claim", (device,), bad))
    for _ in range(2):  # the second time from what the first worked out
        assert cdi.validate(spec) == [
            "containerEdits.mounts[0]: hostPath (absolute) and containerPath are required",
            "containerEdits.mounts[0].options: needs bind or rbind (runc fails without)",
        ]
