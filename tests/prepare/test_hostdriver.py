"""The host driver's files a container gets: found under the driver root, links resolved in it."""

from __future__ import annotations

from pathlib import Path

from dradriver.prepare.hostdriver import driver_mounts

VERSION = "580.159.04"


def _library(directory: Path, name: str, *sonames: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    real = directory / f"{name}.so.{VERSION}"
    real.write_bytes(b"\x7fELF")
    for soname in sonames:
        (directory / soname).symlink_to(real.name)
    return real


def test_a_distribution_layout_mounts_each_library_under_its_versioned_names(tmp_path: Path) -> None:
    _library(tmp_path / "usr/lib/x86_64-linux-gnu", "libcuda", "libcuda.so.1", "libcuda.so")
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/nvidia-smi").write_bytes(b"\x7fELF")
    (tmp_path / "usr/bin/nvidia-smi").chmod(0o755)
    mounts = {(m.container_path, m.host_path) for m in driver_mounts(tmp_path, Path("/host"), VERSION)}
    lib = f"/host/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    assert mounts == {
        (f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}", lib),
        ("/usr/local/nvidia/lib64/libcuda.so.1", lib),
        ("/usr/local/nvidia/bin/nvidia-smi", "/host/usr/bin/nvidia-smi"),
    }


def test_libraries_linked_from_elsewhere_are_mounted_from_the_files_they_resolve_to(tmp_path: Path) -> None:
    """The /usr/local/nvidia layout under a driver root of `/`, reached through the distribution's
    directories by absolute links, as on the GPU machines this ran on."""
    real = _library(tmp_path / "usr/local/nvidia/lib64", "libcuda", "libcuda.so.1")
    distro = tmp_path / "usr/lib/x86_64-linux-gnu"
    distro.mkdir(parents=True)
    (distro / f"libcuda.so.{VERSION}").symlink_to(f"/usr/local/nvidia/lib64/{real.name}")
    (tmp_path / "usr/local/nvidia/bin").mkdir(parents=True)
    (tmp_path / "usr/local/nvidia/bin/nvidia-smi").write_bytes(b"\x7fELF")
    (tmp_path / "usr/local/nvidia/bin/nvidia-smi").chmod(0o755)
    (tmp_path / "usr/bin").mkdir()
    (tmp_path / "usr/bin/nvidia-smi").symlink_to("/usr/local/nvidia/bin/nvidia-smi")
    mounts = {(m.container_path, m.host_path) for m in driver_mounts(tmp_path, Path("/"), VERSION)}
    assert mounts == {
        (f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}", f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"),
        ("/usr/local/nvidia/lib64/libcuda.so.1", f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"),
        ("/usr/local/nvidia/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"),
    }


def test_a_library_reached_only_through_its_soname_link_is_found(tmp_path: Path) -> None:
    """`/usr/lib64/libcuda.so.1 -> /usr/local/nvidia/lib64/libcuda.so.1`, the versioned file only
    in the directory the link points into (the layout of the H100 machine this ran on)."""
    real = _library(tmp_path / "usr/local/nvidia/lib64", "libcuda", "libcuda.so.1")
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64/libcuda.so.1").symlink_to("/usr/local/nvidia/lib64/libcuda.so.1")
    mounts = {(m.container_path, m.host_path) for m in driver_mounts(tmp_path, Path("/"), VERSION)}
    assert mounts == {
        (f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}", f"/{real.relative_to(tmp_path)}"),
        ("/usr/local/nvidia/lib64/libcuda.so.1", f"/{real.relative_to(tmp_path)}"),
    }
