"""The bare container of tests/gpu (a private mount namespace, a probe root, nothing of the host but
a claim's CDI edits) checked without a GPU: with the fake libcuda and `serve` on the fake backend,
the probe sees exactly the claimed GPU, as the runtime-made containers of tests/prepare/test_podman
do. So when tests/gpu runs on a GPU node, what differs is the GPU, not the harness."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dradriver import kubeletclient
from dradriver.backend.select import open_backend
from dradriver.discovery.model import Gpu
from tests.fakenvml import cuda
from tests.gpu.bare_root import run
from tests.gpu.test_real_gpu import claim_for, spec_edits
from tests.helpers import ServeProcess, short_tmpdir

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a private mount namespace and mknod need root"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)"),
    pytest.mark.skipif(
        platform.machine() != "x86_64", reason="the probe roots copy this machine's x86-64 glibc"
    ),
]


@contextmanager
def fake_gpu_claim(build: cuda.CudaBuild) -> Iterator[tuple[Gpu, dict[str, Any]]]:
    """gpu-6 of the fake dgx-h100 prepared by `serve` over a driver root with the fake libcuda and
    nvidia-smi: the GPU and its spec's edits (their host files live as long as the block)."""
    inventory = open_backend("dgx-h100").discover()
    gpu = next(g for g in inventory.gpus if g.minor == 6)
    with short_tmpdir() as root:
        driver = root / "driver-root"
        libs = driver / "usr/lib/x86_64-linux-gnu"
        libs.mkdir(parents=True)
        cuda.with_table(build.libcuda, inventory, libs / f"libcuda.so.{inventory.driver_version}")
        (libs / "libcuda.so.1").symlink_to(f"libcuda.so.{inventory.driver_version}")
        (driver / "usr/bin").mkdir(parents=True)
        shutil.copy(build.nvidia_smi, driver / "usr/bin/nvidia-smi")
        serve = ServeProcess(root, ["--driver-root", str(driver)]).start()
        try:
            claim = claim_for(serve, 1, "gpu-6", [])
            with kubeletclient.DRAClient(serve.dra_socket) as client:
                assert client.prepare([claim]).claims[claim.uid].error == ""
            edits = spec_edits(serve, claim)
        finally:
            serve.kill()
        yield gpu, edits


def test_the_bare_container_shows_cuda_only_the_claimed_gpu(tmp_path: Path) -> None:
    build = cuda.build(tmp_path / "build")
    roots = {r.name: r for r in cuda.probe_roots(tmp_path / "roots", build)}
    with fake_gpu_claim(build) as (gpu, edits):
        for name, probe_root in roots.items():
            copy = tmp_path / "run" / name
            shutil.copytree(probe_root.path, copy, symlinks=True)
            result = run(edits, copy, probe_root.env, probe_root.command, read_only=name == "debian-slim")
            probed = cuda.parse_probe(result.stdout)
            assert probed.ok, f"{name}: {result.stdout}{result.stderr}"
            assert set(probed.devices) == {cuda.bare_uuid(gpu.uuid)}, name
            assert probed.nvidia_smi == (f"GPU 0: {gpu.product_name} (UUID: {gpu.uuid})",), name


#: Run in the host image: what a program finds of the driver there.
LOOK_AROUND = """
import ctypes, json, os, subprocess
cache = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
triton = os.environ["TRITON_LIBCUDA_PATH"]
lib = ctypes.CDLL("libcuda.so.1")
print(json.dumps({
    "inCache": [line.split()[-1] for line in cache.splitlines() if line.split()[0].startswith("libcuda.so")],
    "tritonDir": sorted(n for n in os.listdir(triton) if n.startswith("libcuda")),
    "cuInit": lib.cuInit(0),
}))
"""


def test_a_host_image_has_the_hosts_software_and_only_the_specs_driver(tmp_path: Path) -> None:
    """tests/gpu's image for Triton (--host-image), checked without a GPU: the host's Python runs
    there, libcuda.so.1 is the spec's (found by SONAME, absent from the image's ld.so.cache), and
    TRITON_LIBCUDA_PATH names a directory with both names Triton needs."""
    build = cuda.build(tmp_path / "build")
    version = open_backend("dgx-h100").discover().driver_version
    with fake_gpu_claim(build) as (_, edits):
        env = (f"PATH={Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin",)
        result = run(edits, tmp_path / "image", env, (sys.executable, "-c", LOOK_AROUND), host_image=True)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout)
    assert seen["inCache"] == [], seen
    assert seen["tritonDir"] == ["libcuda.so", "libcuda.so.1", f"libcuda.so.{version}"], seen
    assert seen["cuInit"] == 0, seen
