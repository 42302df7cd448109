"""What the release tests (and the e2e suite, which deploys a release) share: a release directory,
a fresh clone of this tree, and dradriver run from elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dradriver import data

REPO = Path(__file__).resolve().parents[2]
#: The repository directories that ship in the package, under dradriver/data/.
SHIPPED = data.DIRECTORIES
#: A directory `make release` wrote: the release tests check it instead of building one, and the
#: e2e suite deploys it (CI builds it once, from its fresh clone).
RELEASE_ENV = "DRADRIVER_RELEASE"


@dataclass(frozen=True)
class ReleaseDirectory:
    """What `make release` wrote (scripts/release.py), as its release.json names it."""

    out: Path
    manifest: dict[str, Any]

    @classmethod
    def read(cls, out: Path) -> ReleaseDirectory:
        path = out / "release.json"
        if not path.is_file():
            raise FileNotFoundError(f"{out}: no release.json (not a directory `make release` wrote)")
        return cls(out, json.loads(path.read_text()))

    @property
    def archive(self) -> Path:
        return self.out / str(self.manifest["image"]["archive"])

    @property
    def device_classes(self) -> Path:
        return self.out / str(self.manifest["deviceClasses"])

    @property
    def optional_device_classes(self) -> Path:
        """deviceclasses/optional/: whole GPUs, GPU models, one class per MIG profile."""
        return self.out / str(self.manifest["optionalDeviceClasses"])

    @property
    def chart(self) -> Path:
        """The packaged Helm chart, image.digest pinned to the archive's image."""
        return self.out / str(self.manifest["chart"])

    def manifests(self, kustomization: str) -> Path:
        """The rendered manifests of deploy/<kustomization>, the image pinned by digest."""
        return self.out / str(self.manifest["manifests"][kustomization])

    def blob(self, digest: str) -> bytes:
        with tarfile.open(self.archive) as archive:
            member = archive.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None, digest
            return member.read()


def build_release(clone: Path, version: str, out: Path) -> ReleaseDirectory:
    """scripts/release.py of `clone` into `out`."""
    done = run([sys.executable, str(clone / "scripts/release.py"), version, "--out", str(out)], cwd=clone)
    assert done.returncode == 0, f"release.py failed:\n{done.stderr[-4000:]}"
    assert done.stdout.strip().splitlines()[-1] == str(out)
    return ReleaseDirectory.read(out)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def fresh_clone(dest: Path) -> Path:
    """A clone of HEAD with this work tree's changes on top (tracked files and untracked ones git
    does not ignore): what a clone would hold were the tree committed, and nothing else. In CI,
    which runs in a fresh clone, that is the commit itself."""
    git(REPO, "rev-parse", "HEAD")  # fails loudly outside a git checkout
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)], check=True)
    changed = git(REPO, "diff", "-z", "--name-only", "--no-renames", "HEAD").split("\0")
    changed += git(REPO, "ls-files", "-z", "--others", "--exclude-standard").split("\0")
    for name in filter(None, changed):
        source, target = REPO / name, dest / name
        if target.is_symlink() or target.is_file():
            target.unlink()
        if source.is_symlink() or source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return dest


def environment() -> dict[str, str]:
    """This environment less DRADRIVER_* settings and anything that would put this checkout on
    the import path."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("DRADRIVER_", "PYTHON"))}


def run(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), capture_output=True, text=True, cwd=cwd, env=environment(), timeout=600, check=False
    )


def checkout_dradriver() -> list[str]:
    """dradriver as this checkout runs it (the dev venv's editable install)."""
    return [sys.executable, "-m", "dradriver"]
