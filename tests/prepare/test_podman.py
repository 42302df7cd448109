"""A real CDI consumer: podman injects what our prepared claims' specs say.

Needs podman, runc and busybox-static (Debian), and root (podman 4.3 reads specs only from
/etc/cdi and /var/run/cdi); skipped with the reason otherwise. `.ci/run` installs them when it can.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver import kubeletclient
from dradriver.backend.select import open_backend as open_library
from dradriver.discovery import MigDevice
from dradriver.plugin.driver import ClaimRef
from tests.fakenvml import cuda
from tests.fakenvml.cuda import CudaBuild, ProbeRoot
from tests.helpers import DRIVER, ServeProcess, allocated_claim, opaque, running_serve, short_tmpdir, uid

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


def podman_run(
    rootfs: Path,
    cdi_ids: list[str],
    command: Sequence[str],
    env: Sequence[str] = (),
    *,
    read_only: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`command` in a container of `rootfs` (kept pristine: an overlay) with these CDI devices."""
    assert PODMAN is not None
    argv = [PODMAN, "--runtime", "runc", "run", "--rm", "--network=none"]
    argv += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    for cdi_id in cdi_ids:
        argv += ["--device", cdi_id]
    for entry in env:
        argv += ["--env", entry]
    argv += ["--read-only"] if read_only else []
    argv += ["--rootfs", f"{rootfs}:O", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def run_in_container(rootfs: Path, cdi_ids: list[str], script: str) -> str:
    result = podman_run(rootfs, cdi_ids, ["/bin/sh", "-c", script], ["NVIDIA_VISIBLE_DEVICES=all"])
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
    """A host driver tree as the NVIDIA installer leaves it: versioned libs and SONAME links."""
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for lib, soname in (("libcuda", "libcuda.so.1"), ("libnvidia-ml", "libnvidia-ml.so.1")):
        (libdir / f"{lib}.so.{version}").write_text(f"fake {lib}\n")
        (libdir / soname).symlink_to(f"{lib}.so.{version}")
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
            "/dev/nvidia-uvm-tools; ls /dev; cat /usr/local/nvidia/lib64/libcuda.so.1 "
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libnvidia-ml.so.1",
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
    assert lines.count("fake libcuda") == 2
    assert "fake libnvidia-ml" in lines
    assert "nvidia0" not in out.split()  # only the allocated GPUs are visible


def test_podman_injects_mig_caps_nodes(rootfs: Path, published_specs: list[Path]) -> None:
    with running_serve(["--fake-gpus", "dgx-a100-mig"]) as serve:
        from dradriver.backend.select import open_backend as open_library
        from dradriver.devicemodel import build_devices
        from dradriver.discovery import MigDevice

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


# --- CUDA in every image: the probe (tests/fakenvml) loads libcuda.so.1 by SONAME -------------

needs_x86_64 = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the probe roots copy this machine's x86-64 glibc"
)


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory: pytest.TempPathFactory) -> CudaBuild:
    return cuda.build(tmp_path_factory.mktemp("cuda"))


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory, cuda_build: CudaBuild) -> dict[str, ProbeRoot]:
    return {r.name: r for r in cuda.probe_roots(tmp_path_factory.mktemp("roots"), cuda_build)}


def cuda_driver_root(root: Path, profile: str, build: CudaBuild) -> Path:
    """A host driver tree serving `profile`'s GPUs to the fake libcuda, its nvidia-smi a wrapper
    script around the ELF binary (as on the H100 machine issue 24 was found on)."""
    inventory = open_library(profile).discover()
    version = inventory.driver_version
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    cuda.with_table(build.libcuda, inventory, libdir / f"libcuda.so.{version}")
    (libdir / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    shutil.copy(build.stub, libdir / f"libnvidia-ml.so.{version}")  # mounted, never loaded here
    (libdir / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{version}")
    (root / "usr/lib/nvidia/bin").mkdir(parents=True)
    shutil.copy(build.nvidia_smi, root / "usr/lib/nvidia/bin/nvidia-smi")
    (root / "usr/bin").mkdir(parents=True)
    wrapper = root / "usr/bin/nvidia-smi"
    wrapper.write_text('#!/bin/sh\nexec /usr/lib/nvidia/bin/nvidia-smi "$@"\n')
    wrapper.chmod(0o755)
    return root


def publish(serve: ServeProcess, ref: ClaimRef, published_specs: list[Path]) -> None:
    spec = serve.cdi_dir / f"k8s.gpu.dradriver.dev-claim_{ref.uid}.json"
    copy = SYSTEM_CDI_DIR / spec.name
    SYSTEM_CDI_DIR.mkdir(parents=True, exist_ok=True)
    published_specs.append(copy)
    shutil.copy(spec, copy)


def probe(root: ProbeRoot, cdi_ids: list[str], *, read_only: bool = False) -> cuda.Probed:
    result = podman_run(root.path, cdi_ids, root.command, root.env, read_only=read_only)
    probed = cuda.parse_probe(result.stdout)
    assert probed.ok, f"{root.name}: exit {result.returncode}\n{result.stdout}{result.stderr}"
    return probed


@contextmanager
def cuda_serve(profile: str, build: CudaBuild) -> Iterator[ServeProcess]:
    with driver_root_dir() as root:
        args = ["--fake-gpus", profile, "--driver-root", str(cuda_driver_root(root, profile, build))]
        with running_serve(args) as serve:
            yield serve


def gpu_claim(
    serve: ServeProcess, number: int, device: str, published: list[Path], **extra: Any
) -> list[str]:
    claim = allocated_claim(f"claim-{number}", uid(number), [{"request": "gpu", "device": device}], **extra)
    ref, cdi_ids = prepare(serve.claims_dir, serve.dra_socket, claim)
    publish(serve, ref, published)
    return cdi_ids


def smi_line(position: int, name: str, uuid: str) -> str:
    return f"GPU {position}: {name} (UUID: {uuid})"


@needs_x86_64
def test_cuda_loads_by_soname_and_sees_its_gpu_in_every_image_layout(
    cuda_build: CudaBuild, roots: dict[str, ProbeRoot], published_specs: list[Path]
) -> None:
    """One GPU of eight: in a slim Debian root (read-only), a lib64 root whose cache names a CUDA
    stub, a root with its own LD_LIBRARY_PATH and an nvidia/cuda-style root, the probe loads the
    host driver's libcuda.so.1 by SONAME, sees that GPU alone, and runs nvidia-smi from PATH with
    no shell (the driver root's nvidia-smi is a wrapper script)."""
    gpu = next(g for g in open_library("dgx-h100").discover().gpus if g.minor == 3)
    with cuda_serve("dgx-h100", cuda_build) as serve:
        cdi_ids = gpu_claim(serve, 70, "gpu-3", published_specs)
        seen = {name: probe(root, cdi_ids, read_only=name == "debian-slim") for name, root in roots.items()}
    for name, probed in seen.items():
        root = roots[name]
        assert probed.libcuda.rsplit("/", 1)[0] in (root.libcuda_dir, f"/lib/{cuda.TRIPLET}"), (name, probed)
        assert probed.devices == {cuda.bare_uuid(gpu.uuid): (100, gpu.memory_bytes, gpu.product_name)}, name
        assert probed.nvidia_smi == (smi_line(0, gpu.product_name, gpu.uuid),), name
        own = next((e.partition("=")[2] for e in root.env if e.startswith("LD_LIBRARY_PATH=")), "-")
        assert probed.ld_library_path == own, name  # the image's own, never replaced
    assert seen["lib64"].libcuda == "/usr/lib64/libcuda.so.1"  # the host's, mounted over the stub
    assert seen["own-ld-library-path"].needed == {cuda.HELPER_SONAME: f"/opt/app/lib/{cuda.HELPER_SONAME}"}
    assert seen["cuda-image"].libcuda == "/usr/local/nvidia/lib64/libcuda.so.1"


@needs_x86_64
def test_two_claims_in_one_container_see_both_gpus(
    cuda_build: CudaBuild, roots: dict[str, ProbeRoot], published_specs: list[Path]
) -> None:
    gpus = {g.minor: g for g in open_library("dgx-h100").discover().gpus}
    with cuda_serve("dgx-h100", cuda_build) as serve:
        cdi_ids = gpu_claim(serve, 71, "gpu-5", published_specs) + gpu_claim(
            serve, 72, "gpu-2", published_specs
        )
        probed = probe(roots["debian-slim"], cdi_ids)
    assert set(probed.devices) == {cuda.bare_uuid(gpus[m].uuid) for m in (2, 5)}
    assert sorted(probed.nvidia_smi) == sorted(
        smi_line(i, gpus[m].product_name, gpus[m].uuid) for i, m in enumerate((2, 5))
    )


@needs_x86_64
def test_a_mig_claim_sees_its_mig_device_only(
    cuda_build: CudaBuild, roots: dict[str, ProbeRoot], published_specs: list[Path]
) -> None:
    """Its parent GPU's node and its two nvidia-caps access nodes: the GPU's other MIG devices
    (same parent node, other caps) stay out of sight."""
    from dradriver.devicemodel import build_devices

    devices = build_devices(open_library("dgx-a100-mig").discover(), driver_name=DRIVER).devices
    migs = [d for d in devices if isinstance(d.hardware, MigDevice) and d.hardware.parent_minor == 0]
    assert len(migs) > 1
    chosen = migs[-1].hardware
    assert isinstance(chosen, MigDevice)
    with cuda_serve("dgx-a100-mig", cuda_build) as serve:
        probed = probe(roots["lib64"], gpu_claim(serve, 73, migs[-1].name, published_specs))
    assert list(probed.devices) == [cuda.bare_uuid(chosen.uuid)]
    assert probed.nvidia_smi[0].endswith(f"(UUID: {chosen.uuid})")


@needs_x86_64
def test_an_mps_share_sees_its_gpu_within_its_limits(
    cuda_build: CudaBuild, roots: dict[str, ProbeRoot], published_specs: list[Path]
) -> None:
    """The fake libcuda is the MPS stand-in's client, through the pipe directory the spec mounts."""
    gpu = next(g for g in open_library("dgx-h100").discover().gpus if g.minor == 4)
    mps = {
        "strategy": "MPS",
        "mps": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "2Gi"},
    }
    config = [opaque({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": mps})]
    with cuda_serve("dgx-h100", cuda_build) as serve:
        probed = probe(
            roots["own-ld-library-path"], gpu_claim(serve, 74, "gpu-4", published_specs, config=config)
        )
    assert probed.devices == {cuda.bare_uuid(gpu.uuid): (30, 2 << 30, gpu.product_name)}
