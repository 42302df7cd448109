"""What the release tests share: a fresh clone of this tree, and dradriver run from elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dradriver import data

REPO = Path(__file__).resolve().parents[2]
#: The repository directories that ship in the package, under dradriver/data/.
SHIPPED = data.DIRECTORIES


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
