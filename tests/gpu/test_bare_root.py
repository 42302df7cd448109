"""The bare container of tests/gpu (a private mount namespace, a probe root, nothing of the host but
a claim's CDI edits) checked without a GPU: with the fake libcuda and `serve` on the fake backend,
the probe sees exactly the claimed GPU, as the runtime-made containers of tests/prepare/test_podman
do. So when tests/gpu runs on a GPU node, what differs is the GPU, not the harness."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import pytest

from dradriver import kubeletclient
from dradriver.backend.select import open_backend
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


def test_the_bare_container_shows_cuda_only_the_claimed_gpu(tmp_path: Path) -> None:
    build = cuda.build(tmp_path / "build")
    roots = {r.name: r for r in cuda.probe_roots(tmp_path / "roots", build)}
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
        for name, probe_root in roots.items():
            copy = tmp_path / "run" / name
            shutil.copytree(probe_root.path, copy, symlinks=True)
            result = run(edits, copy, probe_root.env, probe_root.command, read_only=name == "debian-slim")
            probed = cuda.parse_probe(result.stdout)
            assert probed.ok, f"{name}: {result.stdout}{result.stderr}"
            assert set(probed.devices) == {cuda.bare_uuid(gpu.uuid)}, name
            assert probed.nvidia_smi == (f"GPU 0: {gpu.product_name} (UUID: {gpu.uuid})",), name
