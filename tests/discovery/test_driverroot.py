"""Finding the host driver's files under a driver root, symlinks resolved inside it."""

from __future__ import annotations

from pathlib import Path

from dradriver.discovery.driverroot import find_library, nvml_library, resolve_in_root


def test_relative_and_absolute_links_resolve_inside_the_root(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    real = lib / "libnvidia-ml.so.570.124.06"
    real.write_bytes(b"\x7fELF")
    (lib / "libnvidia-ml.so.1").symlink_to(real.name)
    (lib / "libcuda.so.1").symlink_to("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.124.06")
    (tmp_path / "lib").symlink_to("usr/lib")

    assert nvml_library(tmp_path) == real
    assert find_library(tmp_path, "libcuda.so.1") == real
    assert resolve_in_root(tmp_path, "lib/x86_64-linux-gnu/libnvidia-ml.so.1") == real


def test_links_never_leave_the_root(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64"
    lib.mkdir(parents=True)
    # On the host this would be /etc/passwd; inside the root it does not exist.
    (lib / "libnvidia-ml.so.1").symlink_to("../../../../../../etc/passwd")
    assert nvml_library(tmp_path) is None
    (lib / "libloop.so").symlink_to("libloop.so")
    assert find_library(tmp_path, "libloop.so") is None


def test_missing_library_and_directories(tmp_path: Path) -> None:
    assert nvml_library(tmp_path) is None
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64/libnvidia-ml.so.1").mkdir()
    assert nvml_library(tmp_path) is None
