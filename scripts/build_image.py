"""`make image`: the plugin's OCI image as an archive, built without Docker or a registry.

Debian bookworm's essential packages plus python3 (mmdebstrap), and a virtual environment at
/opt/dradriver holding this tree's wheel (or the one given) and exactly the dependencies that
requirements.lock pins, hash-checked — the same content as deploy/Dockerfile's image. The result
is an OCI image layout in one tar file that `ctr -n k8s.io images import` (or `podman load`)
takes; the image is named `ghcr.io/dradriver/dradriver:<version>` (IMAGE_REPOSITORY), which is what
the manifests in deploy/ refer to.

Usage: build_image.py [--out DIR] [--tag NAME:TAG] [--constraints LOCK] [--wheel FILE] [--mirror URL]
Prints the archive's path. Needs root or unprivileged user namespaces (mmdebstrap), network access
to a Debian mirror and to the Python package index.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Every runtime dependency pinned with hashes (`make lock` writes it for the interpreter below).
LOCK = REPO / "requirements.lock"
#: Where the project publishes its image: a name of its own, so that a node that lacks the image
#: never pulls a stranger's from a public namespace (deploy/base/kustomization.yaml: newName).
IMAGE_REPOSITORY = "ghcr.io/dradriver/dradriver"
SUITE = "bookworm"
#: The image's interpreter and platform (bookworm's python3 on x86_64, glibc 2.36).
PYTHON_VERSION = "3.11"
ARCH = "x86_64"
GLIBC = (2, 36)
#: The wheel platform tags it runs: pip does not expand a manylinux tag to the older ones itself.
WHEEL_PLATFORMS = (
    *(f"manylinux_{GLIBC[0]}_{minor}_{ARCH}" for minor in range(GLIBC[1], 4, -1)),
    *(f"{legacy}_{ARCH}" for legacy in ("manylinux2014", "manylinux2010", "manylinux1")),
)
VENV = "/opt/dradriver"
#: Debian packages on top of the essential set: the interpreter, and the C++ runtime that the
#: grpcio and google-re2 wheels link against.
PACKAGES = ("python3", "libstdc++6")
NATIVE_IMPORTS = (
    "import grpc, re2, pydantic_core, yaml, google.protobuf, dradriver.daemon, dradriver.offline.cel"
)
#: Left out of the image: documentation and translations nobody reads in a node agent.
PATH_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")


def version() -> str:
    namespace: dict[str, object] = {}
    exec((REPO / "src/dradriver/__init__.py").read_text(), namespace)  # noqa: S102 - our own file
    return str(namespace["__version__"])


def source_date_epoch() -> str:
    """The last commit's time, so that two builds of one commit write the same timestamps."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        return os.environ["SOURCE_DATE_EPOCH"]
    done = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "0"


def collect_wheels(wheels: Path, lock: Path, wheel: Path | None) -> None:
    """The package's wheel (built from this tree unless given), the locked dependencies' wheels
    for the image's interpreter whatever runs this script, and pip's own (the image's installer)."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels.mkdir(parents=True, exist_ok=True)
    if wheel is not None:
        shutil.copy2(wheel, wheels)
    else:
        subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(REPO)], check=True)
    platforms = [option for tag in WHEEL_PLATFORMS for option in ("--platform", tag)]
    target = ["--only-binary=:all:", *platforms, "--python-version", PYTHON_VERSION]
    subprocess.run(
        [*pip, "download", "--no-deps", "--require-hashes", *target, "--dest", str(wheels), "-r", str(lock)],
        check=True,
    )
    subprocess.run([*pip, "download", "--no-deps", "--dest", str(wheels), "pip"], check=True)


def build_rootfs(wheels: Path, layer: Path, mirror: str, epoch: str) -> None:
    """mmdebstrap writes the root filesystem straight into a tar, installing the venv on the way."""
    [pip_wheel] = sorted(wheels.glob("pip-*.whl"))
    hooks = [
        f'copy-in "{wheels}" /tmp',
        f'chroot "$1" python3 -m venv --without-pip {VENV}',
        # Offline, from the collected wheels only: a dependency the lock misses fails here.
        f'chroot "$1" {VENV}/bin/python /tmp/{wheels.name}/{pip_wheel.name}/pip install -q '
        f"--no-index --no-cache-dir --disable-pip-version-check --find-links /tmp/{wheels.name} dradriver",
        f'chroot "$1" {VENV}/bin/python /tmp/{wheels.name}/{pip_wheel.name}/pip check',
        f'rm -rf "$1/tmp/{wheels.name}" "$1"/var/cache/* "$1"/var/log/*',
        # Every native extension must load: a missing system library shows here, not on a node.
        f'chroot "$1" {VENV}/bin/python -c "{NATIVE_IMPORTS}"',
        f'chroot "$1" {VENV}/bin/dradriver --version',
    ]
    command = ["mmdebstrap", "--variant=essential", f"--include={','.join(PACKAGES)}", "--quiet"]
    command += [f"--dpkgopt=path-exclude={pattern}" for pattern in PATH_EXCLUDES]
    command += [f"--customize-hook={hook}" for hook in hooks]
    command += [SUITE, str(layer), mirror]
    subprocess.run(command, check=True, env={**os.environ, "SOURCE_DATE_EPOCH": epoch})


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config that say how a container runs."""

    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    user: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        config: dict[str, object] = {"Env": list(self.env), "WorkingDir": "/"}
        if self.entrypoint is not None:
            config["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            config["Cmd"] = list(self.cmd)
        if self.user:
            config["User"] = self.user
        if self.labels:
            config["Labels"] = dict(self.labels)
        return config


#: What the plugin's container runs with: the same as deploy/Dockerfile.
DRADRIVER_CONFIG = ImageConfig(
    env=(
        f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONUNBUFFERED=1",
        "PYTHONDONTWRITEBYTECODE=1",
    ),
    entrypoint=("dradriver",),
    cmd=("serve",),
    user="65532:65532",
    labels={
        "org.opencontainers.image.title": "dradriver",
        "org.opencontainers.image.description": "Kubernetes DRA kubelet plugin for NVIDIA GPUs",
        "org.opencontainers.image.licenses": "Apache-2.0",
    },
)


def _blob(blobs: Path, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_archive(layer_tar: Path, out: Path, images: Mapping[str, ImageConfig], epoch: int) -> None:
    """An OCI image layout as one tar file: one image per reference, all sharing `layer_tar`.

    Deterministic: the same layer, configs and epoch give the same bytes.
    """
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        layout = Path(work)
        blobs = layout / "blobs/sha256"
        blobs.mkdir(parents=True)
        raw = layer_tar.read_bytes()
        diff_id = hashlib.sha256(raw).hexdigest()
        layer = _blob(blobs, gzip.compress(raw, compresslevel=6, mtime=0))
        del raw
        created = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        manifests = []
        for reference, image in images.items():
            config = {
                "architecture": "amd64",
                "os": "linux",
                "created": created,
                "config": image.to_json(),
                "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
            }
            manifest = {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    **_blob(blobs, _json(config)),
                },
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
            }
            manifests.append(
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **_blob(blobs, _json(manifest)),
                    "annotations": {
                        "io.containerd.image.name": reference,
                        "org.opencontainers.image.ref.name": reference.rsplit(":", 1)[1],
                    },
                }
            )
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests,
        }
        (layout / "index.json").write_bytes(_json(index))
        (layout / "oci-layout").write_bytes(_json({"imageLayoutVersion": "1.0.0"}))
        partial = out.with_name(f".{out.name}.tmp")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            for path in sorted(layout.rglob("*")):
                info = archive.gettarinfo(str(path), str(path.relative_to(layout)))
                info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
                if path.is_file():
                    with path.open("rb") as handle:
                        archive.addfile(info, handle)
                else:
                    archive.addfile(info)
        partial.replace(out)


def image_reference(tag: str) -> str:
    """`dradriver:0.1.0` -> `docker.io/library/dradriver:0.1.0`, as containerd names it."""
    name, _, version = tag.rpartition(":") if ":" in tag.rsplit("/", 1)[-1] else (tag, "", "latest")
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in name.split("/", 1)[0] and ":" not in name.split("/", 1)[0]:
        name = f"docker.io/{name}"
    return f"{name}:{version}"


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build/image", help="output directory")
    parser.add_argument("--tag", default=f"{IMAGE_REPOSITORY}:{version()}", help="image name and tag")
    parser.add_argument(
        "--constraints",
        type=Path,
        default=LOCK,
        metavar="LOCK",
        help="every dependency pinned with hashes, as `make lock` writes it (default: requirements.lock)",
    )
    parser.add_argument("--wheel", type=Path, help="the dradriver wheel to install (default: this tree's)")
    parser.add_argument("--mirror", default="http://deb.debian.org/debian", help="Debian mirror")
    args = parser.parse_args()
    if shutil.which("mmdebstrap") is None:
        print("build_image: mmdebstrap is not installed (apt-get install mmdebstrap)", file=sys.stderr)
        return 2
    reference = image_reference(args.tag)
    args.out.mkdir(parents=True, exist_ok=True)
    epoch = source_date_epoch()
    name, version_ = reference.rsplit("/", 1)[1].rsplit(":", 1)
    archive = args.out / f"{name}-{version_}.oci.tar"
    with tempfile.TemporaryDirectory(dir=args.out) as work:
        wheels = Path(work) / "wheels"
        collect_wheels(wheels, args.constraints, args.wheel)
        layer = Path(work) / "rootfs.tar"
        build_rootfs(wheels, layer, args.mirror, epoch)
        write_archive(layer, archive, {reference: DRADRIVER_CONFIG}, int(epoch))
    print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
