"""The driver on a real NVIDIA GPU: discovery against nvidia-smi, the fake profile of the same
model against the real GPU, and `serve` preparing a whole GPU and an MPS share that a CUDA
program then uses through the CDI spec's own files, on the host and in a bare container of each
image layout (tests/gpu/bare_root.py: a private mount namespace, a root with glibc and the CUDA
probe, nothing of the host but the spec's edits). Time slicing is not applied here: that
changes a setting of the GPU (see test_time_slicing_tool_takes_our_arguments)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dradriver import kubeletclient
from dradriver.backend.select import builtin_profile_names, open_backend
from dradriver.discovery.model import Gpu
from dradriver.plugin.driver import ClaimRef
from tests.fakenvml import cuda
from tests.fakenvml.cuda import ProbeRoot
from tests.gpu import bare_root
from tests.gpu.conftest import HostDriver
from tests.helpers import DRIVER, ServeProcess, allocated_claim, opaque, short_tmpdir, uid, wait_for

PROBE = Path(__file__).with_name("cuda_probe.py")
TRITON_PROBE = Path(__file__).with_name("triton_probe.py")
#: Attributes that name this very GPU or host driver rather than the model.
PER_GPU = {
    "uuid",
    "minor",
    "gpuModuleID",
    "driverVersion",
    "cudaDriverVersion",
    "numaNode",
    "resource.kubernetes.io/numaNode",
}


def discover(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "dradriver", "discover", "-o", "json", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def nvidia_smi(host_driver: HostDriver, *fields: str) -> list[list[str]]:
    out = subprocess.run(
        [host_driver.tool("nvidia-smi"), f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[v.strip() for v in line.split(",")] for line in out.splitlines() if line.strip()]


def test_discover_agrees_with_nvidia_smi(host_driver: HostDriver) -> None:
    found = discover(*host_driver.serve_args())
    assert found["skipped"] == []
    gpus = {d["attributes"]["uuid"]["string"]: d for d in found["devices"] if d["hardware"]["kind"] == "gpu"}
    rows = nvidia_smi(
        host_driver, "uuid", "name", "memory.total", "driver_version", "pci.bus_id", "compute_cap"
    )
    assert set(gpus) == {row[0] for row in rows}
    for uuid, name, memory_mib, driver_version, bus_id, compute_cap in rows:
        attributes, capacity = gpus[uuid]["attributes"], gpus[uuid]["capacity"]
        assert attributes["productName"]["string"] == name
        assert capacity["memory"]["value"] == f"{memory_mib}Mi"
        assert found["driverVersion"] == driver_version
        assert attributes["resource.kubernetes.io/pciBusID"]["string"] == bus_id.lower().removeprefix("0000")
        major, minor = compute_cap.split(".")
        assert attributes["cudaComputeCapability"]["version"] == f"{major}.{minor}.0"
        node = Path(gpus[uuid]["hardware"]["deviceNode"])
        assert stat.S_ISCHR(node.stat().st_mode)
        assert (
            f"{os.major(node.stat().st_rdev)}:{os.minor(node.stat().st_rdev)}"
            == gpus[uuid]["hardware"]["charDevice"]
        )


def test_the_fake_profile_of_this_model_matches_the_real_gpu(host_driver: HostDriver) -> None:
    real = host_driver.inventory.gpus[0]
    fakes = {name: gpu for name in builtin_profile_names() if (gpu := _same_model(name, real)) is not None}
    if not fakes:
        pytest.skip(f"no built-in fake profile has a {real.product_name} with MIG mode as the real one")
    found = discover(*host_driver.serve_args())
    for profile, fake in fakes.items():
        where = f"fake profile {profile} against the real {real.product_name}"
        if not real.mig_enabled:  # in MIG mode the GPU itself is not published
            fake_model = _model(_first_device(discover("--fake-gpus", profile), fake.uuid))
            real_model = _model(_first_device(found, real.uuid))
            differences = {
                f"{part}.{key}": (fake_model[part].get(key), real_model[part].get(key))
                for part in ("attributes", "capacity")
                for key in fake_model[part].keys() | real_model[part].keys()
                if fake_model[part].get(key) != real_model[part].get(key)
            }
            assert differences == {}, f"{where}: (fake, real) {differences}"
        if real.mig_profiles:  # NVML lists them only where MIG can be used
            assert fake.mig_profiles == real.mig_profiles, where


def _same_model(profile: str, real: Gpu) -> Gpu | None:
    """The profile's first GPU of the real one's model and MIG mode."""
    library = open_backend(profile)
    try:
        gpus = library.discover().gpus
    finally:
        library.close()
    return next(
        (g for g in gpus if (g.product_name, g.mig_enabled) == (real.product_name, real.mig_enabled)), None
    )


def _first_device(found: dict[str, Any], uuid: str) -> dict[str, Any]:
    return next(d for d in found["devices"] if d["attributes"]["uuid"]["string"] == uuid)


def _model(device: dict[str, Any]) -> dict[str, Any]:
    attributes = {
        k: v for k, v in device["attributes"].items() if k not in PER_GPU and not k.startswith("resource.")
    }
    return {"attributes": attributes, "capacity": device["capacity"]}


def claim_for(serve: ServeProcess, number: int, device: str, config: list[dict[str, object]]) -> ClaimRef:
    claim = allocated_claim(
        f"claim-{number}", uid(number), [{"request": "gpu", "device": device}], config=config
    )
    (serve.claims_dir / f"claim-{number}.yaml").write_text(yaml.safe_dump(claim))
    return ClaimRef(namespace="default", name=f"claim-{number}", uid=uid(number))


def spec_edits(serve: ServeProcess, claim: ClaimRef) -> dict[str, Any]:
    """The claim's CDI spec, its device's container edits merged with the spec-wide ones."""
    (path,) = [p for p in serve.cdi_dir.glob("*.json") if claim.uid in p.name]
    spec = json.loads(path.read_text())
    merged: dict[str, list[Any]] = {"env": [], "deviceNodes": [], "mounts": []}
    for edits in [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]:
        for key in merged:
            merged[key] += edits.get(key) or []
    return merged


def _probe(edits: dict[str, Any], env: dict[str, str], *args: str) -> dict[str, Any]:
    """The CUDA probe loading the libcuda.so.1 the spec mounts, as the container would."""
    # The same host file, mounted in each directory where images look for libraries.
    (libcuda,) = {m["hostPath"] for m in edits["mounts"] if m["containerPath"].endswith("/libcuda.so.1")}
    result = subprocess.run(
        [sys.executable, str(PROBE), libcuda, *args],
        capture_output=True,
        text=True,
        env=os.environ | env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    probed: dict[str, Any] = json.loads(result.stdout)
    return probed


@pytest.fixture
def serve(host_driver: HostDriver) -> Any:
    with short_tmpdir() as root:
        # The node's own /dev: a device node the host driver has not made yet is made there.
        args = [*host_driver.serve_args(), "--host-dev", "/dev"]
        process = ServeProcess(root, args, fake_gpus=None).start()
        try:
            yield process
        finally:
            process.kill()


def test_serve_prepares_a_real_gpu_that_cuda_then_uses(host_driver: HostDriver, serve: ServeProcess) -> None:
    gpu = host_driver.inventory.gpus[0]
    health = serve.plugins_dir / DRIVER / "health.json"
    wait_for(health.exists, 30, f"health.json (log: {serve.log()})")
    report = json.loads(health.read_text())
    assert report["source"] == "nvml"
    assert {d["health"] for d in report["devices"]} == {"HEALTHY"}, report  # XID events registered
    claim = claim_for(serve, 1, f"gpu-{gpu.minor}", [])
    with kubeletclient.DRAClient(serve.dra_socket) as client:
        prepared = client.prepare([claim]).claims[claim.uid]
        assert prepared.error == "", prepared.error
        edits = spec_edits(serve, claim)
        for node in edits["deviceNodes"]:
            assert stat.S_ISCHR(Path(node.get("hostPath", node["path"])).stat().st_mode), node
        for mount in edits["mounts"]:
            assert Path(mount["hostPath"]).exists(), mount
        assert any(n["path"] == f"/dev/nvidia{gpu.minor}" for n in edits["deviceNodes"])
        probed = _probe(edits, {}, "--context")
        assert gpu.uuid in [d["uuid"] for d in probed["devices"]], probed
        assert client.unprepare([claim]).claims[claim.uid].error == ""
        assert list(serve.cdi_dir.glob("*.json")) == []


def test_an_mps_claim_serves_a_cuda_client_within_its_limits(
    host_driver: HostDriver, serve: ServeProcess
) -> None:
    control = host_driver.tool("nvidia-cuda-mps-control")
    gpu = host_driver.inventory.gpus[0]
    mps = {
        "strategy": "MPS",
        "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
    }
    config = [opaque({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": mps})]
    claim = claim_for(serve, 2, f"gpu-{gpu.minor}", config)
    with kubeletclient.DRAClient(serve.dra_socket) as client:
        whole = _probe({"mounts": _host_libcuda(host_driver)}, {}, "--context")["devices"][0]
        prepared = client.prepare([claim]).claims[claim.uid]
        assert prepared.error == "", f"{prepared.error} (log: {serve.log()[-2000:]})"
        edits = spec_edits(serve, claim)
        (pipe,) = [m["hostPath"] for m in edits["mounts"] if m["containerPath"] == "/tmp/nvidia-mps"]
        assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
        shared = _probe(edits, {"CUDA_MPS_PIPE_DIRECTORY": pipe}, "--context")["devices"][0]
        servers = subprocess.run(
            [control],
            input="get_server_list\n",
            capture_output=True,
            text=True,
            check=True,
            env=os.environ | {"CUDA_MPS_PIPE_DIRECTORY": pipe},
        ).stdout.split()
        assert servers, "the client ran without an MPS server"
        assert shared["smCount"] < whole["smCount"], (shared, whole)
        assert client.unprepare([claim]).claims[claim.uid].error == ""
        assert not Path(pipe).exists()
        print(json.dumps({"whole": whole, "mps": shared, "servers": servers}))


def _host_libcuda(host_driver: HostDriver) -> list[dict[str, str]]:
    from dradriver.discovery.driverroot import find_library

    found = find_library(host_driver.root, "libcuda.so.1")
    assert found is not None
    return [{"hostPath": str(found), "containerPath": "/usr/local/nvidia/lib64/libcuda.so.1"}]


def test_time_slicing_tool_takes_our_arguments(host_driver: HostDriver) -> None:
    """What `compute-policy --set-timeslice` would be called with is what this nvidia-smi takes;
    running it is left out: it changes a setting of the GPU, which the machines lent for these
    checks must keep."""
    out = subprocess.run(
        [host_driver.tool("nvidia-smi"), "compute-policy", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    text = out.stdout + out.stderr
    assert "--set-timeslice" in text, text
    assert "-i" in text, text


@pytest.fixture(scope="module")
def probe_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeRoot]:
    if platform.machine() != "x86_64" or os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the bare containers need root, unshare and x86-64 (their roots copy this glibc)")
    work = tmp_path_factory.mktemp("cuda")
    return {r.name: r for r in cuda.probe_roots(work / "roots", cuda.build(work / "build"))}


def _in_bare_root(edits: dict[str, Any], root: ProbeRoot, work: Path) -> cuda.Probed:
    copy = work / root.name
    shutil.copytree(root.path, copy, symlinks=True)
    result = bare_root.run(edits, copy, root.env, root.command, read_only=root.name == "debian-slim")
    probed = cuda.parse_probe(result.stdout)
    assert probed.ok, f"{root.name}: {result.stdout}{result.stderr}"
    return probed


def test_cuda_in_every_image_layout_sees_the_claimed_gpu_alone(
    host_driver: HostDriver, serve: ServeProcess, probe_roots: dict[str, ProbeRoot], tmp_path: Path
) -> None:
    """Issue 24's check on the GPU it was found on: libcuda.so.1 by SONAME and nvidia-smi from
    PATH in a slim Debian root (read-only), a lib64 root over a CUDA stub, a root with its own
    LD_LIBRARY_PATH and an nvidia/cuda-style root; of several GPUs, only the claimed one."""
    gpu = host_driver.inventory.gpus[-1]
    claim = claim_for(serve, 3, f"gpu-{gpu.minor}", [])
    with kubeletclient.DRAClient(serve.dra_socket) as client:
        assert client.prepare([claim]).claims[claim.uid].error == ""
        edits = spec_edits(serve, claim)
        seen = {name: _in_bare_root(edits, root, tmp_path) for name, root in probe_roots.items()}
        assert client.unprepare([claim]).claims[claim.uid].error == ""
    for name, probed in seen.items():
        assert list(probed.devices) == [cuda.bare_uuid(gpu.uuid)], (name, probed)
        assert len(probed.nvidia_smi) == 1, (name, probed)
        assert f"(UUID: {gpu.uuid})" in probed.nvidia_smi[0], (name, probed)
    assert seen["lib64"].libcuda == "/usr/lib64/libcuda.so.1"
    print(json.dumps({name: {"libcuda": p.libcuda, "nvidia-smi": p.nvidia_smi} for name, p in seen.items()}))


def test_an_mps_share_in_a_bare_container_runs_within_its_limits(
    host_driver: HostDriver, serve: ServeProcess, probe_roots: dict[str, ProbeRoot], tmp_path: Path
) -> None:
    host_driver.tool("nvidia-cuda-mps-control")
    gpu = host_driver.inventory.gpus[0]
    mps = {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}
    config = [opaque({"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": mps})]
    whole_claim = claim_for(serve, 4, f"gpu-{gpu.minor}", [])
    with kubeletclient.DRAClient(serve.dra_socket) as client:
        assert client.prepare([whole_claim]).claims[whole_claim.uid].error == ""
        whole = _in_bare_root(spec_edits(serve, whole_claim), probe_roots["debian-slim"], tmp_path / "whole")
        assert client.unprepare([whole_claim]).claims[whole_claim.uid].error == ""
        claim = claim_for(serve, 5, f"gpu-{gpu.minor}", config)
        prepared = client.prepare([claim]).claims[claim.uid]
        assert prepared.error == "", f"{prepared.error} (log: {serve.log()[-2000:]})"
        shared = _in_bare_root(spec_edits(serve, claim), probe_roots["debian-slim"], tmp_path / "mps")
        assert client.unprepare([claim]).claims[claim.uid].error == ""
    ((uuid, (whole_sms, _, _)),) = whole.devices.items()
    assert shared.devices[uuid][0] < whole_sms, (shared, whole)


def test_triton_runs_a_kernel_in_an_image_without_the_host_driver(
    host_driver: HostDriver, serve: ServeProcess, tmp_path: Path
) -> None:
    """torch.compile's path in an image with Python, PyTorch, Triton and a compiler but nothing of
    the host driver (this host's own software, its driver taken out: bare_root --host-image):
    Triton finds libcuda, links its launcher and runs on the claimed GPU through the spec alone.
    The same without the spec's TRITON_LIBCUDA_PATH shows why it is there (printed)."""
    python = Path(sys.executable)
    has = subprocess.run([python, "-c", "import torch, triton"], capture_output=True, check=False)
    if has.returncode != 0 or shutil.which("gcc") is None:
        pytest.skip(f"needs PyTorch, Triton and gcc beside {python}")
    gpu = host_driver.inventory.gpus[0]
    claim = claim_for(serve, 6, f"gpu-{gpu.minor}", [])
    path = f"PATH={python.parent}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    with kubeletclient.DRAClient(serve.dra_socket) as client:
        assert client.prepare([claim]).claims[claim.uid].error == ""
        edits = spec_edits(serve, claim)
        env = (path, "HOME=/root", "TRITON_CACHE_DIR=/tmp/triton")  # a fresh cache: nothing built before
        result = bare_root.run(
            edits, tmp_path / "image", env, (str(python), str(TRITON_PROBE)), host_image=True
        )
        without = {**edits, "env": [e for e in edits["env"] if not e.startswith("TRITON_LIBCUDA_PATH=")]}
        control = bare_root.run(
            without, tmp_path / "control", env, (str(python), str(TRITON_PROBE)), host_image=True
        )
        assert client.unprepare([claim]).claims[claim.uid].error == ""
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert (seen["ok"], seen["count"]) == (True, 1), seen
    assert seen["uuid"].removeprefix("GPU-") == gpu.uuid.removeprefix("GPU-"), seen
    # The spec's libcuda, by SONAME from the image's own library directory.
    assert seen["libcuda"] == ["/usr/lib/x86_64-linux-gnu/libcuda.so.1"], seen
    last = (control.stderr.strip().splitlines() or ["(no output)"])[-1]
    print(
        json.dumps({"triton": seen, "withoutTritonLibcudaPath": {"exit": control.returncode, "last": last}})
    )
