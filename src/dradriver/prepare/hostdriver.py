"""The host driver's user-space files that containers need, found under `--driver-root`.

Hook-free: each versioned library (`libcuda.so.570.124.06`) is bind-mounted read-only into
`/usr/local/nvidia/lib64`, once under its own name and once under each SONAME that points to it
on the host (`libcuda.so.1`), and `nvidia-smi` into `/usr/local/nvidia/bin`. The nvidia/cuda images
already have those directories on LD_LIBRARY_PATH and PATH; no `nvidia-cdi-hook`, no ldconfig run
inside the container, so nothing on the host beyond the driver itself is required.

`driver_root` is where this process sees the driver; `host_driver_root` is the same tree as the
container runtime on the host sees it (they differ when the plugin runs in a container that
mounts the host's driver root elsewhere). Specs must contain host paths.
"""

from __future__ import annotations

from pathlib import Path

from dradriver.discovery.driverroot import LIBRARY_DIRS, find_binary, find_library, resolve_in_root
from dradriver.prepare.cdi import Mount

CONTAINER_LIB_DIR = "/usr/local/nvidia/lib64"
CONTAINER_BIN_DIR = "/usr/local/nvidia/bin"
#: What CUDA and NVML applications load; graphics and video libraries are left out on purpose.
COMPUTE_LIBRARIES = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-gpucomp",
    "libnvidia-allocator",
    "libnvidia-cfg",
    "libnvidia-opencl",
)
BINARIES = ("nvidia-smi", "nvidia-debugdump")


def driver_mounts(driver_root: Path, host_driver_root: Path, driver_version: str) -> list[Mount]:
    """The mounts of the host driver's files. A library found through a symlink (a distribution's
    `/usr/lib/x86_64-linux-gnu/libcuda.so.<v>` pointing into `/usr/local/nvidia/lib64`) is mounted
    from the file it resolves to, with the SONAME links of that file's directory."""
    mounts: list[Mount] = []

    def host_path(local: Path) -> str:
        return str(host_driver_root / local.relative_to(driver_root))

    for library in COMPUTE_LIBRARIES:
        found = _versioned_library(driver_root, f"{library}.so.{driver_version}")
        if found is None:
            continue
        mounts.append(Mount(host_path(found), f"{CONTAINER_LIB_DIR}/{found.name}"))
        for soname in _sonames_of(driver_root, found):
            mounts.append(Mount(host_path(found), f"{CONTAINER_LIB_DIR}/{soname}"))
    for binary in BINARIES:
        found = find_binary(driver_root, binary)
        if found is not None:
            mounts.append(Mount(host_path(found), f"{CONTAINER_BIN_DIR}/{binary}"))
    return mounts


def _versioned_library(driver_root: Path, name: str) -> Path | None:
    """The file `name` (libcuda.so.580.159.04) in the library directories, or reached from them
    through a link by any other name (only `libcuda.so.1 -> /usr/local/nvidia/lib64/...` there)."""
    found = find_library(driver_root, name)
    if found is not None:
        return found
    for directory in LIBRARY_DIRS:
        base = resolve_in_root(driver_root, directory)
        if base is None or not base.is_dir():
            continue
        # The unversioned development link (libcuda.so) too.
        for entry in sorted(base.glob(f"{name.partition('.so.')[0]}.so*")):
            target = resolve_in_root(driver_root, str(entry.relative_to(driver_root)))
            if target is not None and target.name == name and target.is_file():
                return target
    return None


def _sonames_of(driver_root: Path, library: Path) -> list[str]:
    """Names of the symlinks ldconfig made for this library in its directory (libcuda.so.1 ...)."""
    stem = library.name.partition(".so.")[0] + ".so."
    return [
        entry.name
        for entry in sorted(library.parent.iterdir())
        if entry.is_symlink()
        and entry.name.startswith(stem)
        and resolve_in_root(driver_root, str(entry.relative_to(driver_root))) == library
    ]
