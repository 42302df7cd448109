"""The git commit an installation was built from.

A build (setup.py) writes it into the package as `_build.json`; a checkout, where that file is
absent, asks git at run time. Standard library only: setup.py loads this file by path, before
any dependency is installed.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

#: Written into the built package, and into the sdist so that a wheel built from it keeps it.
EMBEDDED_FILE = "_build.json"
UNKNOWN = "unknown"

TreeState = Literal["clean", "dirty", "unknown"]


@dataclass(frozen=True)
class SourceState:
    """`commit` is the full hash of HEAD; `tree_state` says whether files differed from it."""

    commit: str = UNKNOWN
    tree_state: TreeState = "unknown"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SourceState:
        data = json.loads(text)
        state = data.get("tree_state")
        return cls(
            commit=str(data.get("commit") or UNKNOWN),
            tree_state=state if state in ("clean", "dirty") else "unknown",
        )


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def from_git(root: Path) -> SourceState | None:
    """HEAD of the git work tree whose top level is `root`; None if `root` is not one (an
    unpacked sdist inside another repository must not take that repository's commit)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != root.resolve():
        return None
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain")
    if commit is None or status is None:
        return None
    return SourceState(commit.strip(), "dirty" if status.strip() else "clean")


def of_source_tree(root: Path) -> SourceState:
    """What a build of the tree at `root` records: git's answer, else what an sdist recorded."""
    found = from_git(root)
    if found is not None:
        return found
    recorded = root / "src" / "dradriver" / EMBEDDED_FILE
    if recorded.is_file():
        return SourceState.from_json(recorded.read_text())
    return SourceState()


def current() -> SourceState:
    """This installation's: the embedded file of a built package, else (a checkout or an
    editable install) git's answer about the tree this file is in."""
    package = Path(__file__).resolve().parent
    embedded = package / EMBEDDED_FILE
    if embedded.is_file():
        return SourceState.from_json(embedded.read_text())
    root = package.parents[1]
    if (root / ".git").exists():
        return from_git(root) or SourceState()
    return SourceState()
