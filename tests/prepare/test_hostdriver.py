"""The host driver's files a container gets: found under the driver root, links resolved in it,
mounted where any glibc image's loader and PATH find them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dradriver.prepare.edits import common_edits
from dradriver.prepare.hostdriver import driver_mounts, real_executable

VERSION = "580.159.04"
#: Where every library goes on an x86_64 node.
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
BIN_DIRS = ("/usr/bin", "/usr/local/nvidia/bin")


def _library(directory: Path, name: str, *sonames: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    real = directory / f"{name}.so.{VERSION}"
    real.write_bytes(b"\x7fELF")
    for soname in sonames:
        (directory / soname).symlink_to(real.name)
    return real


def _elf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF\x02\x01\x01")
    path.chmod(0o755)
    return path


def _expected(host_file: str, *names: str, dirs: tuple[str, ...] = LIB_DIRS) -> set[tuple[str, str]]:
    return {(f"{d}/{name}", host_file) for d in dirs for name in names}


def _libcuda(host_file: str) -> set[tuple[str, str]]:
    """libcuda's mounts: its two names in every directory, and the development name Triton links
    with where TRITON_LIBCUDA_PATH points."""
    return _expected(host_file, f"libcuda.so.{VERSION}", "libcuda.so.1") | {
        ("/usr/local/nvidia/lib64/libcuda.so", host_file)
    }


def _mounts(root: Path, host_root: Path, machine: str = "x86_64") -> set[tuple[str, str]]:
    return {(m.container_path, m.host_path) for m in driver_mounts(root, host_root, VERSION, machine)}


@pytest.mark.parametrize("host_root", ["/", "/run/nvidia/driver", "/home/kubernetes/bin/nvidia"])
def test_each_library_goes_to_the_images_own_directories_under_its_versioned_names(
    tmp_path: Path, host_root: str
) -> None:
    """Specs name host paths: the driver root on the host (the GPU operator's, GKE's) prefixes them."""
    _library(tmp_path / "usr/lib/x86_64-linux-gnu", "libcuda", "libcuda.so.1", "libcuda.so")
    _elf(tmp_path / "usr/bin/nvidia-smi")
    lib = f"{host_root.rstrip('/')}/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    assert _mounts(tmp_path, Path(host_root)) == _libcuda(lib) | (
        _expected(f"{host_root.rstrip('/')}/usr/bin/nvidia-smi", "nvidia-smi", dirs=BIN_DIRS)
    )


def test_an_arm_node_mounts_into_its_own_multiarch_directory(tmp_path: Path) -> None:
    _library(tmp_path / "usr/lib/aarch64-linux-gnu", "libnvidia-ml", "libnvidia-ml.so.1")
    lib = f"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.{VERSION}"
    dirs = ("/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
    assert _mounts(tmp_path, Path("/"), "aarch64") == _expected(
        lib, f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1", dirs=dirs
    )


def test_libraries_linked_from_elsewhere_are_mounted_from_the_files_they_resolve_to(tmp_path: Path) -> None:
    """The /usr/local/nvidia layout under a driver root of `/`, reached through the distribution's
    directories by absolute links, as on the GPU machines this ran on."""
    real = _library(tmp_path / "usr/local/nvidia/lib64", "libcuda", "libcuda.so.1")
    distro = tmp_path / "usr/lib/x86_64-linux-gnu"
    distro.mkdir(parents=True)
    (distro / f"libcuda.so.{VERSION}").symlink_to(f"/usr/local/nvidia/lib64/{real.name}")
    _elf(tmp_path / "usr/local/nvidia/bin/nvidia-smi")
    (tmp_path / "usr/bin").mkdir()
    (tmp_path / "usr/bin/nvidia-smi").symlink_to("/usr/local/nvidia/bin/nvidia-smi")
    lib = f"/usr/local/nvidia/lib64/libcuda.so.{VERSION}"
    assert _mounts(tmp_path, Path("/")) == _libcuda(lib) | (
        _expected("/usr/local/nvidia/bin/nvidia-smi", "nvidia-smi", dirs=BIN_DIRS)
    )


def test_a_library_reached_only_through_its_soname_link_is_found(tmp_path: Path) -> None:
    """`/usr/lib64/libcuda.so.1 -> /usr/local/nvidia/lib64/libcuda.so.1`, the versioned file only
    in the directory the link points into (the layout of the H100 machine this ran on)."""
    real = _library(tmp_path / "usr/local/nvidia/lib64", "libcuda", "libcuda.so.1")
    (tmp_path / "usr/lib64").mkdir(parents=True)
    (tmp_path / "usr/lib64/libcuda.so.1").symlink_to("/usr/local/nvidia/lib64/libcuda.so.1")
    host = f"/{real.relative_to(tmp_path)}"
    assert _mounts(tmp_path, Path("/")) == _libcuda(host)


def test_a_wrapper_script_is_followed_to_the_binary_it_runs(tmp_path: Path) -> None:
    """An image without a shell cannot run a script: the ELF binary it wraps is mounted instead."""
    real = _elf(tmp_path / "usr/lib/nvidia/bin/nvidia-smi.real")
    (tmp_path / "usr/bin").mkdir(parents=True)
    wrapper = tmp_path / "usr/bin/nvidia-smi"
    wrapper.write_text('#!/bin/sh\nexport LC_ALL=C\nexec /usr/lib/nvidia/bin/nvidia-smi.real "$@"\n')
    wrapper.chmod(0o755)
    assert real_executable(tmp_path, wrapper) == real
    assert _mounts(tmp_path, Path("/run/nvidia/driver")) == _expected(
        "/run/nvidia/driver/usr/lib/nvidia/bin/nvidia-smi.real", "nvidia-smi", dirs=BIN_DIRS
    )


def test_a_script_naming_no_binary_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    script = tmp_path / "usr/bin/nvidia-smi"
    script.write_text("#!/bin/sh\necho no GPU here\n")  # /bin/sh itself is the interpreter, not named below
    script.chmod(0o755)
    _elf(tmp_path / "bin/sh")
    assert real_executable(tmp_path, script) is None
    assert _mounts(tmp_path, Path("/")) == set()


def test_the_gke_layout_under_its_driver_root(tmp_path: Path) -> None:
    """/home/kubernetes/bin/nvidia holds lib64/ and bin/ (GKE's installer), no distribution dirs."""
    _library(tmp_path / "lib64", "libcuda", "libcuda.so.1")
    _elf(tmp_path / "bin/nvidia-smi")
    host = "/home/kubernetes/bin/nvidia"
    assert _mounts(tmp_path, Path(host)) == _libcuda(f"{host}/lib64/libcuda.so.{VERSION}") | _expected(
        f"{host}/bin/nvidia-smi", "nvidia-smi", dirs=BIN_DIRS
    )


def test_triton_is_told_where_libcuda_is_when_the_driver_has_it(tmp_path: Path) -> None:
    """Triton finds libcuda through `ldconfig -p` (no entry in an image: no hook runs ldconfig) or
    TRITON_LIBCUDA_PATH, and links with -lcuda there: the spec names the directory."""
    _library(tmp_path / "usr/lib/x86_64-linux-gnu", "libnvidia-ml", "libnvidia-ml.so.1")
    without = common_edits(None, driver_mounts(tmp_path, Path("/"), VERSION, "x86_64"))
    assert without.env == ("NVIDIA_VISIBLE_DEVICES=void",)
    _library(tmp_path / "usr/lib/x86_64-linux-gnu", "libcuda", "libcuda.so.1")
    edits = common_edits(None, driver_mounts(tmp_path, Path("/"), VERSION, "x86_64"))
    assert edits.env == ("NVIDIA_VISIBLE_DEVICES=void", "TRITON_LIBCUDA_PATH=/usr/local/nvidia/lib64")
    assert ("/usr/local/nvidia/lib64/libcuda.so", f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}") in {
        (m.container_path, m.host_path) for m in edits.mounts
    }
