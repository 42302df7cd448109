"""Which backend a node uses: the fake one for a profile name or file, else NVML."""

from __future__ import annotations

from pathlib import Path

from dradriver.backend.fake.backend import FakeBackend
from dradriver.backend.fake.profile import load_builtin_profile, load_profile_file
from dradriver.backend.fake.profiles import names as builtin_profile_names
from dradriver.backend.interface import GpuBackend
from dradriver.discovery.driverroot import nvml_library as find_nvml
from dradriver.discovery.errors import DiscoveryError

__all__ = ["builtin_profile_names", "open_backend"]


def _looks_like_path(value: str) -> bool:
    return "/" in value or value.endswith((".yaml", ".yml", ".json"))


def open_backend(
    fake_gpus: str | None,
    *,
    driver_root: Path | None = None,
    nvml_library: str | None = None,
    proc_root: Path = Path("/proc"),
    sys_root: Path = Path("/sys"),
) -> GpuBackend:
    """The fake backend for a profile name or file, else NVML.

    NVML is the host driver's libnvidia-ml.so.1 under `driver_root` (where this process sees the
    driver root: a container has no NVML of its own), else whatever the loader finds;
    `nvml_library` names the file outright. `proc_root`/`sys_root` let tests (and containers with
    host mounts) point at other trees. Raises DiscoveryError with a one-line reason when neither
    can be opened.
    """
    if fake_gpus is None:
        # Lazy: pynvml is 0.1 s of imports (-X importtime) that fake GPUs never need, and
        # `dradriver slices/discover --fake-gpus` must not load it (tests/discovery/test_cli.py).
        from dradriver.backend.nvml.backend import NvmlBackend

        if nvml_library is None and driver_root is not None:
            found = find_nvml(driver_root)
            nvml_library = str(found) if found is not None else None
        return NvmlBackend(
            library_path=nvml_library, proc_root=proc_root, sys_root=sys_root, searched_root=driver_root
        )
    if fake_gpus in builtin_profile_names():
        return FakeBackend(load_builtin_profile(fake_gpus), name=fake_gpus)
    path = Path(fake_gpus)
    if path.is_file() or _looks_like_path(fake_gpus):
        return FakeBackend(
            load_profile_file(path), name=path.stem, profile_file=path if path.is_file() else None
        )
    raise DiscoveryError(
        f"unknown fake GPU profile {fake_gpus!r}: not a built-in profile "
        f"({', '.join(builtin_profile_names())}) and no such file"
    )
