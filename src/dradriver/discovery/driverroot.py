"""Files of the host driver (the NVIDIA driver installation) under a driver root.

The driver root is `/` for a driver installed on the host, `/run/nvidia/driver` for the GPU
operator's driver container, and inside the DaemonSet it is mounted somewhere else again
(`/driver-root`). Symlinks in that tree are resolved as if the root were `/`, so an absolute
link (`libnvidia-ml.so.1 -> /usr/lib64/libnvidia-ml.so.570.124.06`) stays inside it.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

NVML_LIBRARY = "libnvidia-ml.so.1"
#: Where distributions and the driver's installers put the libraries, most specific first.
LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
)
BINARY_DIRS = ("usr/bin", "bin", "usr/local/bin")
_MAX_LINKS = 40


def resolve_in_root(root: Path, relative: str) -> Path | None:
    """`root/relative` with every symlink followed inside `root`; None if it does not exist."""
    parts = list(PurePosixPath(relative).parts)
    resolved = PurePosixPath("/")
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "/", "."):
            continue
        if part == "..":
            resolved = resolved.parent
            continue
        candidate = root / str(resolved.relative_to("/") / part)
        if candidate.is_symlink():
            links += 1
            if links > _MAX_LINKS:
                return None
            target = PurePosixPath(os.readlink(candidate))
            if target.is_absolute():
                resolved = PurePosixPath("/")
            parts = list(target.parts) + parts
            continue
        if not candidate.exists():
            return None
        resolved = resolved / part
    return root / str(resolved.relative_to("/"))


def find_library(root: Path, name: str) -> Path | None:
    """The first `name` in the library directories under `root`, symlinks resolved inside it."""
    for directory in LIBRARY_DIRS:
        found = resolve_in_root(root, f"{directory}/{name}")
        if found is not None and found.is_file():
            return found
    return None


def find_binary(root: Path, name: str) -> Path | None:
    """The first executable `name` in the binary directories under `root` (`usr/bin` for a
    driver on the host or in the GPU operator's container, `bin` for /usr/local/nvidia layouts)."""
    for directory in BINARY_DIRS:
        found = resolve_in_root(root, f"{directory}/{name}")
        if found is not None and found.is_file() and os.access(found, os.X_OK):
            return found
    return None


def nvml_library(root: Path) -> Path | None:
    """The NVML library of the host driver under `root`, if it is there."""
    return find_library(root, NVML_LIBRARY)
