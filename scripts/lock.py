"""`make lock`: rewrite requirements.lock from pyproject.toml's runtime dependencies.

Resolved (uv) for the image's interpreter and platform (scripts/build_image.py), every
transitive dependency pinned with the hashes of its files. Pins that still satisfy pyproject.toml
are kept; `--upgrade` takes the newest versions it allows. tests/release/test_lock.py checks the
result is current.

Usage: lock.py [--upgrade]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.build_image import ARCH, GLIBC, LOCK, PYTHON_VERSION, REPO


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--upgrade", action="store_true", help="take the newest versions that pyproject.toml allows"
    )
    args = parser.parse_args()
    uv = Path(sys.executable).parent / "uv"
    command = [
        str(uv),
        "pip",
        "compile",
        str(REPO / "pyproject.toml"),
        "--quiet",
        "--python-version",
        PYTHON_VERSION,
        "--python-platform",
        f"{ARCH}-manylinux_{GLIBC[0]}_{GLIBC[1]}",
        "--generate-hashes",
        "--no-build",
        "--custom-compile-command",
        "make lock",
        "--output-file",
        str(LOCK),
    ]
    if args.upgrade:
        command.append("--upgrade")
    return subprocess.run(command, check=False, cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(main())
