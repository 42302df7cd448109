"""`make release`'s directory, built from a fresh clone by scripts/release.py: every artifact
with its checksum, manifests that pin the archive's image by digest, and an image that holds the
released wheel with exactly the locked dependencies and runs the commands as the checkout does.

The image part needs mmdebstrap (CI installs it); the image's commands run in a chroot (root).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.utils import canonicalize_name

from scripts.build_image import IMAGE_REPOSITORY, VENV, version
from scripts.release import (
    DEVICECLASSES,
    KUSTOMIZATIONS,
    OPTIONAL_DEVICECLASSES,
    ReleaseError,
    check_version,
)
from tests.deploy.manifests import OPTIONAL_DEVICECLASSES_DIR, deviceclasses, render
from tests.helm import chart as helm_chart
from tests.release.release import (
    RELEASE_ENV,
    REPO,
    SHIPPED,
    ReleaseDirectory,
    build_release,
    checkout_dradriver,
    fresh_clone,
    git,
    run,
)
from tests.release.test_lock import read_lock

VERSION = version()

#: The release builds the sdist, the wheel and the image (mmdebstrap): minutes, not seconds.
pytestmark = pytest.mark.timeout(1200)


@dataclass(frozen=True)
class Release(ReleaseDirectory):
    clone: Path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    given = os.environ.get(RELEASE_ENV)
    if given:  # built by CI from its fresh clone, which is this checkout
        directory = ReleaseDirectory.read(Path(given))
        return Release(directory.out, directory.manifest, REPO)
    if shutil.which("mmdebstrap") is None:
        pytest.skip(
            "mmdebstrap not installed: the release's image cannot be built (apt-get install mmdebstrap)"
        )
    clone = fresh_clone(tmp_path_factory.mktemp("clone") / "dradriver")
    directory = build_release(clone, VERSION, tmp_path_factory.mktemp("release") / f"dradriver-{VERSION}")
    return Release(directory.out, directory.manifest, clone)


@pytest.fixture(scope="module")
def rootfs(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's filesystem, unpacked from its one layer."""
    manifest = json.loads(release.blob(release.manifest["image"]["digest"]))
    [layer] = manifest["layers"]
    root = tmp_path_factory.mktemp("rootfs")
    blob = root.parent / "layer.tar.gz"
    blob.write_bytes(release.blob(layer["digest"]))
    subprocess.run(["tar", "-xzf", str(blob), "-C", str(root)], check=True)
    blob.unlink()
    return root


def test_the_tree_is_ready_for_its_version() -> None:
    # What `make release` checks first: __init__'s version, its CHANGELOG section and the tag
    # deploy/base deploys agree.
    check_version(VERSION)
    with pytest.raises(ReleaseError, match=r"VERSION 9\.9\.9, but src/dradriver/__init__\.py says"):
        check_version("9.9.9")


def test_wrong_version_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "release"
    done = run([sys.executable, str(REPO / "scripts/release.py"), "9.9.9", "--out", str(out)], cwd=tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr
        == f"release: VERSION 9.9.9, but src/dradriver/__init__.py says {VERSION}: bump it first\n"
    )
    assert not out.exists()


def test_every_artifact_is_there_with_its_checksum(release: Release) -> None:
    m = release.manifest
    expected = {
        m["wheel"],
        m["sdist"],
        m["image"]["archive"],
        m["lock"],
        *KUSTOMIZATIONS.values(),
        DEVICECLASSES,
        OPTIONAL_DEVICECLASSES,
        m["chart"],
        "release.json",
        "SHA256SUMS",
    }
    assert {p.name for p in release.out.iterdir()} == expected
    assert (m["wheel"], m["sdist"], m["image"]["archive"], m["chart"]) == (
        f"dradriver-{VERSION}-py3-none-any.whl",
        f"dradriver-{VERSION}.tar.gz",
        f"dradriver-{VERSION}.oci.tar",
        f"dradriver-{VERSION}.tgz",
    )
    sums: dict[str, str] = {}
    for line in (release.out / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        sums[name] = digest
    assert set(sums) == expected - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((release.out / name).read_bytes()).hexdigest() == digest, name


def test_release_json_names_the_commit_and_the_image(release: Release) -> None:
    m = release.manifest
    assert m["version"] == VERSION
    assert m["commit"] == git(release.clone, "rev-parse", "HEAD").strip()
    assert m["image"]["reference"] == f"{IMAGE_REPOSITORY}:{VERSION}"
    with tarfile.open(release.out / m["image"]["archive"]) as archive:
        member = archive.extractfile("index.json")
        assert member is not None
        [entry] = json.load(member)["manifests"]
    assert (
        entry["digest"]
        == m["image"]["digest"]
        == f"sha256:{hashlib.sha256(release.blob(entry['digest'])).hexdigest()}"
    )
    assert entry["annotations"]["io.containerd.image.name"] == m["image"]["reference"]
    assert m["image"]["pinned"] == f"{m['image']['reference']}@{m['image']['digest']}"
    assert (release.out / m["lock"]).read_bytes() == (release.clone / "requirements.lock").read_bytes()


@pytest.mark.parametrize("kustomization", list(KUSTOMIZATIONS))
def test_manifests_are_the_kustomizations_with_the_image_pinned(release: Release, kustomization: str) -> None:
    rendered = [d for d in yaml.safe_load_all((release.out / KUSTOMIZATIONS[kustomization]).read_text()) if d]
    expected = json.loads(json.dumps(render(kustomization)))
    for doc in expected:
        if doc["kind"] == "DaemonSet":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                assert container["image"] == f"{IMAGE_REPOSITORY}:{VERSION}"
                container["image"] = release.manifest["image"]["pinned"]
    assert rendered == expected


def test_chart_is_packaged_with_the_image_pinned(release: Release) -> None:
    """The packaged chart renders the plugin from the archive's image, by digest, as the
    manifests do; its version is the release's, and it holds what its links point to."""
    with tarfile.open(release.chart) as archive:
        names = set(archive.getnames())
        chart_yaml = archive.extractfile("dradriver/Chart.yaml")
        assert chart_yaml is not None
        meta = yaml.safe_load(chart_yaml)
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    assert "dradriver/files/deviceclasses/gpu.yaml" in names
    assert not any(name.startswith("dradriver/ci/") for name in names)
    objects = helm_chart.render(chart=release.chart)
    assert helm_chart.plugin_container(objects)["image"] == release.manifest["image"]["pinned"]


def test_deviceclasses_yaml_holds_every_builtin_class(release: Release) -> None:
    shipped = [d for d in yaml.safe_load_all((release.out / DEVICECLASSES).read_text()) if d]
    assert {d["metadata"]["name"]: d for d in shipped} == deviceclasses()
    assert len(shipped) == len(deviceclasses())


def test_deviceclasses_optional_yaml_holds_every_optional_class(release: Release) -> None:
    shipped = [d for d in yaml.safe_load_all((release.out / OPTIONAL_DEVICECLASSES).read_text()) if d]
    assert {d["metadata"]["name"]: d for d in shipped} == deviceclasses(OPTIONAL_DEVICECLASSES_DIR)


def test_image_holds_the_released_wheel_and_exactly_the_lock(release: Release, rootfs: Path) -> None:
    site = rootfs / VENV.lstrip("/") / "lib/python3.11/site-packages"
    installed: dict[str, str] = {}
    for dist_info in site.glob("*.dist-info"):
        name, installed_version = dist_info.name.removesuffix(".dist-info").rsplit("-", 1)
        installed[canonicalize_name(name)] = installed_version
    pinned = {str(name): str(pin.version) for name, pin in read_lock().items()}
    assert installed == {**pinned, "dradriver": VERSION}
    with zipfile.ZipFile(release.out / release.manifest["wheel"]) as wheel:
        for name in wheel.namelist():
            if name.startswith("dradriver/") and not name.endswith("/"):
                assert (site / name).read_bytes() == wheel.read(name), name
    for directory in SHIPPED:
        for path in (REPO / directory).glob("*.yaml"):
            assert (site / "dradriver/data" / directory / path.name).read_bytes() == path.read_bytes()


def in_image(rootfs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    chroot = shutil.which("chroot")
    if chroot is None or os.geteuid() != 0:
        pytest.skip("running the image's dradriver needs root and chroot")
    return subprocess.run(
        [chroot, str(rootfs), f"{VENV}/bin/dradriver", *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        timeout=120,
        check=False,
    )


def test_image_runs_the_commands_as_the_checkout_does(release: Release, rootfs: Path, tmp_path: Path) -> None:
    version_json = in_image(rootfs, "version", "-o", "json")
    assert version_json.returncode == 0, version_json.stderr
    assert json.loads(version_json.stdout)["commit"] == release.manifest["commit"]
    claim = in_image(rootfs, "examples", "two-gpus").stdout
    (rootfs / "tmp/claim.yaml").write_text(claim)
    (tmp_path / "claim.yaml").write_text(claim)
    expression = 'device.attributes["gpu.dradriver.dev"].architecture == "Hopper"'
    for image_args, checkout_args in (
        (
            ["dry-run", "--claim", "/tmp/claim.yaml", "--fake-gpus", "dgx-h100", "-o", "json"],
            ["dry-run", "--claim", str(tmp_path / "claim.yaml"), "--fake-gpus", "dgx-h100", "-o", "json"],
        ),
        (["cel", "eval", "-e", expression, "--fake-gpus", "dgx-h100", "-o", "json"],) * 2,
        (["slices", "--fake-gpus", "mixed", "--node-name", "node-1", "-o", "json"],) * 2,
    ):
        from_image = in_image(rootfs, *image_args)
        from_checkout = run([*checkout_dradriver(), *checkout_args], cwd=tmp_path)
        assert from_image.returncode == from_checkout.returncode == 0, from_image.stderr
        assert from_image.stdout == from_checkout.stdout, image_args[0]
    files = [
        f"{VENV}/lib/python3.11/site-packages/dradriver/data/{d}/{p.name}"
        for d in SHIPPED
        for p in sorted((REPO / d).glob("*.yaml"))
    ]
    validated = in_image(rootfs, "validate", *files)
    assert validated.returncode == 0, validated.stdout + validated.stderr
