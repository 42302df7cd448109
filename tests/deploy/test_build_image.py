"""scripts/build_image.py's OCI archive writer: deterministic, and laid out as runtimes import it.

The whole build (mmdebstrap, the venv) runs in the real-cluster suite, whose DaemonSets use it.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from scripts.build_image import DRADRIVER_CONFIG, ImageConfig, image_reference, write_archive


def layer(tmp_path: Path) -> Path:
    path = tmp_path / "layer.tar"
    with tarfile.open(path, "w") as archive:
        data = b"#!/bin/sh\n"
        info = tarfile.TarInfo("bin/tool")
        info.size, info.mode = len(data), 0o755
        archive.addfile(info, io.BytesIO(data))
    return path


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_archive_is_an_oci_layout_with_one_image_per_reference(tmp_path: Path) -> None:
    out = tmp_path / "image.tar"
    images = {
        "docker.io/library/dradriver:1.2.3": DRADRIVER_CONFIG,
        "docker.io/x/pause:1": ImageConfig(cmd=("sleep",)),
    }
    write_archive(layer(tmp_path), out, images, epoch=1_700_000_000)
    files = members(out)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    names = [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]]
    assert names == list(images)
    for entry in index["manifests"]:
        manifest_bytes = files[f"blobs/sha256/{entry['digest'].split(':')[1]}"]
        assert hashlib.sha256(manifest_bytes).hexdigest() == entry["digest"].split(":")[1]
        manifest = json.loads(manifest_bytes)
        config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
        (layer_ref,) = manifest["layers"]
        assert layer_ref["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        assert f"blobs/sha256/{layer_ref['digest'].split(':')[1]}" in files
        assert config["created"] == "2023-11-14T22:13:20Z"

    def blob(digest: str) -> dict[str, object]:
        loaded: dict[str, object] = json.loads(files[f"blobs/sha256/{digest.split(':')[1]}"])
        return loaded

    plugin_manifest = blob(index["manifests"][0]["digest"])
    plugin: dict[str, dict[str, object]] = blob(plugin_manifest["config"]["digest"])  # type: ignore[index,assignment]
    assert plugin["config"]["Entrypoint"] == ["dradriver"]
    assert plugin["config"]["User"] == "65532:65532"


def test_same_input_same_bytes(tmp_path: Path) -> None:
    source = layer(tmp_path)
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    write_archive(source, first, {"docker.io/library/d:1": DRADRIVER_CONFIG}, epoch=5)
    write_archive(source, second, {"docker.io/library/d:1": DRADRIVER_CONFIG}, epoch=5)
    assert first.read_bytes() == second.read_bytes()


@pytest.mark.parametrize(
    ("tag", "reference"),
    [
        ("dradriver:0.1.0", "docker.io/library/dradriver:0.1.0"),
        ("dradriver", "docker.io/library/dradriver:latest"),
        ("me/dradriver:1", "docker.io/me/dradriver:1"),
        ("registry.example.com:5000/team/dradriver:2", "registry.example.com:5000/team/dradriver:2"),
    ],
)
def test_image_reference_is_what_containerd_names(tag: str, reference: str) -> None:
    assert image_reference(tag) == reference
