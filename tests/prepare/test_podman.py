"""A real CDI consumer: podman injects what our prepared claims' specs say.

Needs podman, runc and busybox-static (Debian), and root (podman 4.3 reads specs only from
/etc/cdi and /var/run/cdi); skipped with the reason otherwise. `.ci/run` installs them when it can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from dradriver import kubeletclient
from dradriver.plugin.driver import ClaimRef
from tests.helpers import allocated_claim, opaque, running_serve, short_tmpdir, uid

PODMAN = shutil.which("podman")
BUSYBOX = shutil.which("busybox")
SYSTEM_CDI_DIR = Path("/var/run/cdi")

pytestmark = [
    pytest.mark.podman,
    pytest.mark.skipif(PODMAN is None or shutil.which("runc") is None, reason="needs podman and runc"),
    pytest.mark.skipif(BUSYBOX is None, reason="needs busybox (Debian busybox-static)"),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="podman 4.3 reads CDI specs only from root-owned system dirs"
    ),
]


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rootfs")
    (root / "bin").mkdir()
    assert BUSYBOX is not None
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "env", "ls", "cat", "stat"):
        (root / "bin" / applet).symlink_to("busybox")
    for directory in ("dev", "proc", "sys", "tmp", "etc", "usr/local/nvidia"):
        (root / directory).mkdir(parents=True)
    return root


@pytest.fixture
def published_specs() -> Iterator[list[Path]]:
    """Spec files copied into the system CDI dir for podman; removed afterwards whatever happens."""
    copies: list[Path] = []
    yield copies
    for path in copies:
        path.unlink(missing_ok=True)


def run_in_container(rootfs: Path, cdi_ids: list[str], script: str) -> str:
    assert PODMAN is not None
    argv = [PODMAN, "--runtime", "runc", "run", "--rm", "--network=none"]
    argv += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    for cdi_id in cdi_ids:
        argv += ["--device", cdi_id]
    argv += ["--env", "NVIDIA_VISIBLE_DEVICES=all", "--rootfs", f"{rootfs}:O", "/bin/sh", "-c", script]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def prepare(
    serve_root_claims: Path, dra_socket: Path, claim: dict[str, object]
) -> tuple[ClaimRef, list[str]]:
    serve_root_claims.mkdir(exist_ok=True)
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    (serve_root_claims / f"{meta['name']}.yaml").write_text(yaml.safe_dump(claim))
    ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
    with kubeletclient.DRAClient(dra_socket) as client:
        entry = client.prepare([ref]).claims[ref.uid]
    assert entry.error == ""
    return ref, [i for d in entry.devices for i in d.cdi_device_ids]


@contextmanager
def driver_root_dir() -> Iterator[Path]:
    with short_tmpdir() as root:
        yield root / "driver-root"


def make_driver_root(root: Path, version: str) -> Path:
    """A host driver tree as the NVIDIA installer leaves it: versioned libs, SONAME links, tools."""
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for lib, soname in (("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1")):
        (libdir / f"{lib}.so.{version}").write_text(f"fake {lib}\n")
        (libdir / soname).symlink_to(f"{lib}.so.{version}")
    (root / "usr/bin").mkdir(parents=True)
    smi = root / "usr/bin/nvidia-smi"
    smi.write_text("#!/bin/sh\necho fake nvidia-smi\n")
    smi.chmod(0o755)
    return root


def test_podman_injects_gpu_nodes_env_and_driver_files(rootfs: Path, published_specs: list[Path]) -> None:
    with (
        driver_root_dir() as root,
        running_serve(["--driver-root", str(make_driver_root(root, "570.124.06"))]) as serve,
    ):
        claim = allocated_claim(
            "two-gpus",
            uid(42),
            [{"request": "a", "device": "gpu-3"}, {"request": "b", "device": "gpu-5"}],
            config=[
                opaque(
                    {
                        "apiVersion": "gpu.dradriver.dev/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
                    }
                )
            ],
        )
        ref, cdi_ids = prepare(serve.claims_dir, serve.dra_socket, claim)
        spec = serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{ref.uid}.json"
        copy = SYSTEM_CDI_DIR / spec.name
        SYSTEM_CDI_DIR.mkdir(parents=True, exist_ok=True)
        published_specs.append(copy)
        shutil.copy(spec, copy)
        out = run_in_container(
            rootfs,
            cdi_ids,
            "env; stat -c 'node %n %t:%T' /dev/nvidia3 /dev/nvidia5 /dev/nvidiactl /dev/nvidia-uvm "
            "/dev/nvidia-uvm-tools; cat /usr/local/nvidia/lib64/libcuda.so.1; "
            "/usr/local/nvidia/bin/nvidia-smi; ls /dev",
        )
    lines = out.splitlines()
    assert "NVIDIA_VISIBLE_DEVICES=void" in lines  # the spec beats the image's/user's "all"
    assert "DRADRIVER_TIMESLICE_INTERVAL=Long" in lines
    assert any(line.startswith("DRADRIVER_DEVICE_GPU_3=GPU-") for line in lines)
    assert any(line.startswith("DRADRIVER_DEVICE_GPU_5=GPU-") for line in lines)
    # stat prints majors and minors in hex: 195 = c3, 255 = ff, 510 = 1fe.
    assert "node /dev/nvidia3 c3:3" in lines
    assert "node /dev/nvidia5 c3:5" in lines
    assert "node /dev/nvidiactl c3:ff" in lines
    assert "node /dev/nvidia-uvm 1fe:0" in lines
    assert "node /dev/nvidia-uvm-tools 1fe:1" in lines
    assert "fake libcuda" in lines
    assert "fake nvidia-smi" in lines
    assert "nvidia0" not in out.split()  # only the allocated GPUs are visible


def test_podman_injects_mig_caps_nodes(rootfs: Path, published_specs: list[Path]) -> None:
    with running_serve(["--fake-gpus", "dgx-a100-mig"]) as serve:
        from dradriver.devicemodel import build_devices
        from dradriver.discovery import MigDevice, open_library

        devices = build_devices(open_library("dgx-a100-mig").discover(), driver_name=serve.driver)
        mig = next(d for d in devices.devices if isinstance(d.hardware, MigDevice))
        hardware = mig.hardware
        assert isinstance(hardware, MigDevice)
        ref, cdi_ids = prepare(
            serve.claims_dir,
            serve.dra_socket,
            allocated_claim("mig", uid(43), [{"request": "m", "device": mig.name}]),
        )
        spec = serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{ref.uid}.json"
        copy = SYSTEM_CDI_DIR / spec.name
        SYSTEM_CDI_DIR.mkdir(parents=True, exist_ok=True)
        published_specs.append(copy)
        shutil.copy(spec, copy)
        out = run_in_container(rootfs, cdi_ids, "stat -c 'node %n %t:%T %a' /dev/nvidia-caps/* /dev/nvidia*")
    gi, ci = hardware.gi_caps_minor, hardware.ci_caps_minor
    assert gi is not None
    assert ci is not None
    assert f"node /dev/nvidia-caps/nvidia-cap{gi} ec:{gi:x} 444" in out  # 236 = ec
    assert f"node /dev/nvidia-caps/nvidia-cap{ci} ec:{ci:x} 444" in out
    assert f"node /dev/nvidia{hardware.parent_minor} c3:{hardware.parent_minor:x}" in out
