"""The host driver's user-space files that containers need, found under `--driver-root`.

Hook-free, and found by any glibc image with no configuration: each versioned library
(`libcuda.so.580.159.04`) is bind-mounted read-only under its own name and under each SONAME that
points to it on the host (`libcuda.so.1`) into three directories:

- `/usr/lib/<multiarch triplet>` (Debian, Ubuntu and everything built on them, the Python and
  Jupyter images among them) and `/usr/lib64` (the RHEL family, UBI): the dynamic loader searches
  its system directories when the image's own `ld.so.cache` has no entry, and a cache entry that
  names a file there (a CUDA stub, a compat package) finds our file mounted over it;
- `/usr/local/nvidia/lib64`, which the nvidia/cuda images name in their `LD_LIBRARY_PATH`.

No `LD_LIBRARY_PATH` is set (an image's own stays as it is), no hook runs `ldconfig` in the
container (which would need a hook binary on the host and a writable root), and the mounts need
no writable root: the runtime creates their targets before it makes the root read-only.

Triton (what `torch.compile` generates kernels with) does not load `libcuda` by SONAME: it looks
it up in `ldconfig -p`, which has no entry without such a hook, else in `TRITON_LIBCUDA_PATH`, and
links its launcher with `-lcuda`, which needs the development name `libcuda.so`. So the spec sets
`TRITON_LIBCUDA_PATH` to `/usr/local/nvidia/lib64` and mounts `libcuda` there as `libcuda.so` too.
`nvidia-smi` goes to `/usr/bin` (on every image's PATH) and `/usr/local/nvidia/bin`, as the ELF
binary itself: a driver root's `nvidia-smi` may be a shell script that wraps it, which an image
without a shell cannot run, so a script is followed to the binary it names.

`driver_root` is where this process sees the driver; `host_driver_root` is the same tree as the
container runtime on the host sees it (they differ when the plugin runs in a container that
mounts the host's driver root elsewhere). Specs must contain host paths.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from collections.abc import Sequence
from pathlib import Path

from dradriver import logs
from dradriver.discovery.driverroot import LIBRARY_DIRS, find_binary, find_library, resolve_in_root
from dradriver.prepare.cdi import Mount

CONTAINER_LIB_DIR = "/usr/local/nvidia/lib64"
CONTAINER_BIN_DIR = "/usr/local/nvidia/bin"
#: On the PATH of every image (the OCI default and every distribution's).
IMAGE_BIN_DIR = "/usr/bin"
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
#: `libcuda` under the name `-lcuda` links with, in the directory Triton is told of (see above).
LIBCUDA_LINK = f"{CONTAINER_LIB_DIR}/libcuda.so"
TRITON_LIBCUDA_PATH = f"TRITON_LIBCUDA_PATH={CONTAINER_LIB_DIR}"
#: A wrapper script is read this far for the path of the binary it runs.
_MAX_SCRIPT_BYTES = 64 * 1024
_ELF_MAGIC = b"\x7fELF"
_ABSOLUTE_PATH = re.compile(rb"/[A-Za-z0-9_.+/-]+")

log = logs.get_logger(component="prepare")


def image_lib_dirs(machine: str | None = None) -> tuple[str, ...]:
    """The library directories a glibc image's loader searches by default, for this machine
    (`x86_64`, `aarch64`): the multiarch one of Debian and Ubuntu, then the RHEL family's."""
    machine = machine or platform.machine()
    return (f"/usr/lib/{machine}-linux-gnu", "/usr/lib64")


def library_dirs(machine: str | None = None) -> tuple[str, ...]:
    """Every container directory the libraries are mounted into."""
    return (*image_lib_dirs(machine), CONTAINER_LIB_DIR)


def driver_mounts(
    driver_root: Path, host_driver_root: Path, driver_version: str, machine: str | None = None
) -> list[Mount]:
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
        for name in (found.name, *_sonames_of(driver_root, found)):
            mounts += [Mount(host_path(found), f"{d}/{name}") for d in library_dirs(machine)]
        if library == "libcuda":
            mounts.append(Mount(host_path(found), LIBCUDA_LINK))
    for binary in BINARIES:
        found = find_binary(driver_root, binary)
        if found is None:
            continue
        executable = real_executable(driver_root, found)
        if executable is None:
            log.warning(
                "host driver tool left out of container specs: not an ELF binary, nor a script "
                "naming one under the driver root",
                tool=host_path(found),
            )
            continue
        mounts += [Mount(host_path(executable), f"{d}/{binary}") for d in (IMAGE_BIN_DIR, CONTAINER_BIN_DIR)]
    return mounts


def driver_env(mounts: Sequence[Mount]) -> tuple[str, ...]:
    """The environment the driver's files need in a container: Triton's `libcuda` directory, when
    `libcuda` is among the mounts."""
    return (TRITON_LIBCUDA_PATH,) if any(m.container_path == LIBCUDA_LINK for m in mounts) else ()


def real_executable(driver_root: Path, found: Path) -> Path | None:
    """`found` if it is an ELF file; for a script (`#!`), the first executable ELF file under
    `driver_root` whose absolute path the script names; else None."""
    try:
        with found.open("rb") as file:
            head = file.read(_MAX_SCRIPT_BYTES)
    except OSError:
        return None
    if head.startswith(_ELF_MAGIC):
        return found
    if not head.startswith(b"#!"):
        return None
    for match in _ABSOLUTE_PATH.finditer(head.partition(b"\n")[2]):
        target = resolve_in_root(driver_root, match.group().decode())
        if target is not None and target != found and _is_elf_executable(target):
            return target
    return None


def _is_elf_executable(path: Path) -> bool:
    if not path.is_file() or not os.access(path, os.X_OK):
        return False
    try:
        with path.open("rb") as file:
            return file.read(4) == _ELF_MAGIC
    except OSError:
        return False


def _names_in(directory: Path) -> tuple[str, ...]:
    """The entries of a library directory: listed once for all the libraries looked up in it (a
    distribution's /usr/lib/<triplet> holds over a thousand), again only once it has changed."""
    try:
        return _listing(str(directory), directory.stat().st_mtime_ns)
    except OSError:
        return ()


@functools.lru_cache(maxsize=16)
def _listing(directory: str, mtime_ns: int) -> tuple[str, ...]:  # noqa: ARG001 - the cache key
    return tuple(os.listdir(directory))


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
        prefix = f"{name.partition('.so.')[0]}.so"
        for entry in sorted(base / n for n in _names_in(base) if n.startswith(prefix)):
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
