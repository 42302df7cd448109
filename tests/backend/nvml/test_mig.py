"""MIG devices created and destroyed through the real NVML code path (pynvml over ctypes) against
the C fake libnvidia-ml.so.1: in process, then through `dradriver serve` over gRPC, including a
kill -9 between the GPU instance and the compute instance, and prepares racing on one GPU."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from dradriver.backend.nvml.discovery import NvmlLibrary
from dradriver.backend.nvml.mig import NvmlMigControl
from dradriver.backend.select import open_backend
from dradriver.cli import main
from dradriver.discovery import MigPlacement, NodeInventory
from dradriver.discovery.nvidia_caps import driver_layout_minor
from dradriver.kubeletclient import DRAClient
from dradriver.mig import MigError
from dradriver.plugin.driver import ClaimRef
from dradriver.prepare.checkpoint import CheckpointStore, ClaimState
from tests.backend.nvml.conftest import FakeNode, FakeNodeFactory
from tests.fakenvml.harness import CONFIG_ENV, config_text, write_proc
from tests.helpers import (
    DRIVER,
    ServeProcess,
    allocated_claim,
    free_port,
    scrape,
    short_tmpdir,
    uid,
    wait_for,
)

STATE_ENV = "FAKE_NVML_STATE"


@pytest.fixture
def inventory() -> NodeInventory:
    return open_backend("a100-mig-empty").discover()


@pytest.fixture
def node(
    fake_node: FakeNodeFactory, inventory: NodeInventory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> FakeNode:
    monkeypatch.setenv(STATE_ENV, str(tmp_path / "mig-state"))
    return fake_node(inventory)


@pytest.fixture
def control(node: FakeNode) -> Iterator[NvmlMigControl]:
    opened = NvmlMigControl(library_path=str(node.library), proc_root=node.proc_root)
    yield opened
    opened.close()


def profile(inventory: NodeInventory, name: str) -> Any:
    return next(p for p in inventory.gpus[0].mig_profiles if p.name == name)


def test_create_read_find_and_destroy(
    control: NvmlMigControl, node: FakeNode, inventory: NodeInventory
) -> None:
    gpu = inventory.gpus[0]
    three_g = profile(inventory, "3g.40gb")
    gi = control.create_gpu_instance(gpu, three_g, MigPlacement(4, 4))
    assert control.find_gpu_instance(gpu.uuid, three_g.profile_id, MigPlacement(4, 4)) == gi
    assert control.find_gpu_instance(gpu.uuid, three_g.profile_id, MigPlacement(0, 4)) is None
    mig = control.create_compute_instance(gpu, gi)
    assert (mig.parent_uuid, mig.gi_id, mig.ci_id, mig.profile) == (gpu.uuid, gi, 0, "3g.40gb")
    assert mig.placement == MigPlacement(4, 4)
    assert mig.full_gpu_instance
    assert mig.resources == three_g.resources
    assert (mig.gi_caps_minor, mig.ci_caps_minor) == (
        driver_layout_minor(0, gi),
        driver_layout_minor(0, gi, 0),
    )
    assert mig.uuid.startswith("MIG-")
    # Discovery sees it exactly as the control returned it.
    assert node.discover().gpus[0].mig_devices == (mig,)
    assert control.destroy(gpu.uuid, gi) is True
    assert node.discover().gpus[0].mig_devices == ()
    assert control.destroy(gpu.uuid, gi) is False


def test_nvml_refusals_carry_their_reason(control: NvmlMigControl, inventory: NodeInventory) -> None:
    gpu = inventory.gpus[0]
    gi = control.create_gpu_instance(gpu, profile(inventory, "3g.40gb"), MigPlacement(4, 4))
    with pytest.raises(MigError, match="nvmlDeviceCreateGpuInstanceWithPlacement: Fake NVML error") as caught:
        control.create_gpu_instance(gpu, profile(inventory, "1g.10gb"), MigPlacement(5, 1))
    assert caught.value.reason == "insufficient_resources"
    control.create_compute_instance(gpu, gi)
    with pytest.raises(MigError) as second:
        control.create_compute_instance(gpu, gi)  # the first compute instance spans it already
    assert second.value.reason == "insufficient_resources"
    # NVML refuses to remove a GPU instance that still has compute instances.
    import pynvml

    handle = pynvml.nvmlDeviceGetGpuInstanceById(pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid), gi)
    with pytest.raises(pynvml.NVMLError) as in_use:
        pynvml.nvmlGpuInstanceDestroy(handle)
    assert in_use.value.value == pynvml.NVML_ERROR_IN_USE
    assert control.destroy(gpu.uuid, gi) is True  # compute instances first, then the GPU instance


def test_mig_devices_outlive_the_process_that_made_them(
    control: NvmlMigControl, node: FakeNode, inventory: NodeInventory
) -> None:
    gpu = inventory.gpus[0]
    gi = control.create_gpu_instance(gpu, profile(inventory, "4g.40gb"), MigPlacement(0, 4))
    mig = control.create_compute_instance(gpu, gi)
    control.close()  # NVML shut down: the next init reads the node afresh, state file included
    library = NvmlLibrary(library_path=str(node.library), proc_root=node.proc_root)
    try:
        assert library.discover().gpus[0].mig_devices == (mig,)
    finally:
        library.close()


# --- through `dradriver serve` ------------------------------------------------------------------


class NvmlServe:
    """serve without --fake-gpus, on the C fake NVML, with --partitionable."""

    def __init__(self, root: Path, library: Path, inventory: NodeInventory, extra_config: str = "") -> None:
        self.config = root / "nvml.conf"
        self.state = root / "mig-state"
        self.proc = root / "proc"
        write_proc(inventory, self.proc)
        self.inventory = inventory
        self.write_config(extra_config)
        env = {
            "LD_LIBRARY_PATH": str(library.parent),
            CONFIG_ENV: str(self.config),
            STATE_ENV: str(self.state),
        }
        self.metrics_port = free_port()
        args = ["--partitionable", "--proc-root", str(self.proc)]
        args += ["--metrics-address", f"127.0.0.1:{self.metrics_port}"]
        self.serve = ServeProcess(root, args, env, fake_gpus=None)
        self.serve.claims_dir.mkdir(exist_ok=True)
        self.checkpoint = CheckpointStore(self.serve.plugins_dir / DRIVER)

    def write_config(self, extra: str = "") -> None:
        self.config.write_text(config_text(self.inventory) + extra)

    def claim(self, n: int, device: str) -> ClaimRef:
        claim = allocated_claim(f"mig-{n}", uid(n), [{"request": "mig", "device": device}])
        (self.serve.claims_dir / f"mig-{n}.yaml").write_text(yaml.safe_dump(claim))
        return ClaimRef("default", f"mig-{n}", uid(n))

    def _lines(self, kind: str) -> list[list[str]]:
        lines = self.state.read_text().splitlines() if self.state.exists() else []
        return [line.split("\t") for line in lines if line.startswith(f"{kind}\t")]

    def gpu_instances(self) -> list[list[str]]:
        """The GPU instances of the fake GPU's state: [gi, GPU, id, profile, start, size]."""
        return self._lines("gi")

    def mig_devices(self) -> list[str]:
        """The UUIDs of its MIG devices."""
        return [fields[2] for fields in self._lines("mig")]


@pytest.fixture
def served(fake_nvml_library: Path, inventory: NodeInventory) -> Iterator[NvmlServe]:
    with short_tmpdir() as root:
        node = NvmlServe(root, fake_nvml_library, inventory)
        try:
            yield node
        finally:
            node.serve.kill()


def prepared(response: Any, ref: ClaimRef) -> Any:
    result = response.claims[ref.uid]
    assert result.error == "", result.error
    return result


def status(served: NvmlServe, capsys: pytest.CaptureFixture[str], *output: str) -> str:
    capsys.readouterr()
    assert main(["status", "--kubelet-plugins-dir", str(served.serve.plugins_dir), *output]) == 0
    return capsys.readouterr().out


def test_serve_creates_and_destroys_mig_devices(
    served: NvmlServe, capsys: pytest.CaptureFixture[str]
) -> None:
    small, large = served.claim(1, "gpu-0-mig-3g40gb-4"), served.claim(2, "gpu-0-mig-4g40gb-0")
    served.serve.start()
    with DRAClient(served.serve.dra_socket) as client:
        prepared(client.prepare([small]), small)
        prepared(client.prepare([large]), large)
        assert sorted(gi[4] for gi in served.gpu_instances()) == ["0", "4"]
        devices = served.mig_devices()
        assert len(set(devices)) == 2
        spec = json.loads((served.serve.cdi_dir / f"k8s.{DRIVER}-claim_{small.uid}.json").read_text())
        [device] = spec["devices"]
        assert device["containerEdits"]["env"][0].split("=")[1] in devices
        assert device["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
        assert len(device["containerEdits"]["deviceNodes"]) == 3  # the GPU and two nvidia-caps nodes

        # status names each created MIG device with the claim that owns it.
        report = json.loads(status(served, capsys, "-o", "json"))
        created = {
            d["device"]: (c["name"], d["uuid"], d["createdMig"]["gpuInstance"])
            for c in report["claims"]
            for d in c["devices"]
        }
        assert set(created) == {"gpu-0-mig-3g40gb-4", "gpu-0-mig-4g40gb-0"}
        assert created["gpu-0-mig-3g40gb-4"][0] == "mig-1"
        assert {uuid for _, uuid, _ in created.values()} == set(devices)
        table = status(served, capsys)
        assert "MIG devices dradriver created (2)" in table
        assert "gpu-0-mig-3g40gb-4" in table.split("MIG devices dradriver created")[1]

        assert client.unprepare([small, large]).claims[small.uid].error == ""
    assert served.gpu_instances() == []
    assert served.checkpoint.load().claims == {}  # type: ignore[union-attr]
    metrics = scrape(served.metrics_port)
    assert "dradriver_mig_devices_created_total 2.0" in metrics
    assert "dradriver_mig_devices_destroyed_total 2.0" in metrics
    assert "MIG devices dradriver created" not in status(served, capsys)


def test_kill_9_between_the_gpu_instance_and_the_compute_instance(served: NvmlServe) -> None:
    ref = served.claim(3, "gpu-0-mig-3g40gb-0")
    served.write_config("fail\tnvmlGpuInstanceCreateComputeInstance\t*\t-9\n")
    served.serve.start()
    with DRAClient(served.serve.dra_socket) as client, pytest.raises(grpc.RpcError):
        client.prepare([ref])
    assert served.serve.proc is not None
    assert served.serve.proc.wait(10) == -signal.SIGKILL
    # What the crash left: the GPU instance without a compute instance, recorded before it was made.
    [gi] = served.gpu_instances()
    assert served.mig_devices() == []
    stored = served.checkpoint.load()
    assert stored is not None
    [record] = stored.claims[ref.uid].devices
    assert stored.claims[ref.uid].state is ClaimState.PREPARE_STARTED
    assert record.mig is not None
    assert record.mig.gi_id == int(gi[2])

    served.write_config()
    served.serve.start()
    wait_for(lambda: served.serve.log().count('"driver ready"') == 2, 20, "recovery")
    assert served.gpu_instances() == [], served.serve.log()
    assert served.checkpoint.load().claims == {}  # type: ignore[union-attr]
    with DRAClient(served.serve.dra_socket) as client:
        prepared(client.prepare([ref]), ref)  # the kubelet's retry now succeeds
    assert len(served.mig_devices()) == 1


def test_prepares_racing_on_one_gpu_take_turns(served: NvmlServe) -> None:
    """The fake refuses MIG reconfigurations that overlap on one GPU (NVML_ERROR_IN_USE); slowed
    down, two prepares of the same GPU arriving together would overlap unless serialized."""
    served.write_config(
        "slow\tnvmlDeviceCreateGpuInstanceWithPlacement\t150\nslow\tnvmlGpuInstanceCreateComputeInstance\t150\n"
    )
    refs = [
        served.claim(10 + i, device) for i, device in enumerate(["gpu-0-mig-3g40gb-4", "gpu-0-mig-4g40gb-0"])
    ]
    served.serve.start()
    errors: dict[str, str] = {}
    start = threading.Barrier(len(refs))

    def prepare(ref: ClaimRef) -> None:
        with DRAClient(served.serve.dra_socket) as client:
            client.wait_ready(10)
            start.wait()
            errors[ref.uid] = client.prepare([ref]).claims[ref.uid].error

    threads = [threading.Thread(target=prepare, args=(ref,)) for ref in refs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == {ref.uid: "" for ref in refs}
    assert "being reconfigured by another call" not in served.serve.log()
    assert len(served.mig_devices()) == 2
